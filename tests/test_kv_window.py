"""Sliding-window attention in the KV-cache prediction: Gemma 3's windowed layers hold the
window (as llama.cpp's iSWA cache allocates it), other targets and families the whole
context. The llama.cpp figures are checked against what llama.cpp itself allocates in
test_llamacpp_allocates_what_is_predicted (and benchmarks/llamacpp_swa_kv.py)."""

from __future__ import annotations

import json
import logging
import re
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters.planner import Budgets, plan
from edgekit.converters.planner.admission import memory_parts
from edgekit.converters.planner.memory import attention_layers
from edgekit.converters.planner.memory import kv_cache_bytes as _kv_cache_bytes
from edgekit.targets.registry import get_target

from edgekit.devices import load_profile
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from tests.conftest import require

MIB = 1 << 20
# google/gemma-3-270m's config.json (the structural keys; no weights needed)
GEMMA3_270M: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "rope_theta": 1000000.0,
    "query_pre_attn_scalar": 256,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}


def kv_cache_bytes(
    spec: ModelSpec, tokens: int, kv_cache: str = "f16", *, target: str | None = None
) -> int:
    """The KV cache ``target`` (a registered target's name; None: every token on every
    layer) allocates, as the planner predicts it from the target's KvCacheLayout."""
    layout = get_target(target).kv_cache if target is not None else None
    return _kv_cache_bytes(spec, tokens, kv_cache, layout=layout)


def _kv_of_variant(spec: ModelSpec, target: str, context: int) -> int:
    """The KV cache in load's admission memory for ``spec`` as a built ``target`` variant."""
    t = get_target(target)
    return memory_parts(
        spec, t, t.units[0].formats[0], context=context, kv_cache="f16", unit_kind="cpu"
    ).kv_cache_bytes


def _spec(tmp_path: Path, name: str = "g", **changes: Any) -> ModelSpec:
    config = {**GEMMA3_270M, **changes}
    config = {k: v for k, v in config.items() if v is not None}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return inspect_model(folder)


# (context, target) -> MiB of f16 KV cache for Gemma 3 270M. One position of one layer is
# 2 x 1 KV head x 256 x 2 bytes = 1 KiB. llama.cpp: 3 global layers x pad256(ctx) +
# 15 windowed layers x pad256(min(ctx, 512 + 512 micro-batch)); MLX: the window exactly;
# OpenVINO (and no target): 18 x ctx.
SWA_TABLE: list[tuple[int, str | None, float]] = [
    (512, "llamacpp", 18 * 512 / 1024),  # the window covers the context: no saving
    (512, "openvino", 9.0),
    (1000, "llamacpp", 18.0),  # padded to 1024 cells; the window + batch is 1024 too
    (1000, "openvino", 18 * 1000 / 1024),
    (1000, None, 18 * 1000 / 1024),
    (2048, "llamacpp", 3 * 2 + 15 * 1),
    (2048, "openvino", 36.0),
    (4096, "llamacpp", 3 * 4 + 15 * 1),
    (4096, "mlx", 3 * 4 + 15 * 0.5),
    (4096, "qnn", 72.0),
    (32768, "llamacpp", 96 + 15),  # the 111 MiB
    (32768, "openvino", 576.0),  # the 576 MiB: the whole context everywhere
    (32768, "tensorrt", 576.0),
    (32768, None, 576.0),
    (32768, "mlx", 96 + 7.5),
]


@pytest.mark.parametrize(("context", "target", "mib"), SWA_TABLE)
def test_gemma3_270m_kv_cache(tmp_path: Path, context: int, target: str | None, mib: float) -> None:
    spec = _spec(tmp_path)
    assert kv_cache_bytes(spec, context, target=target) == pytest.approx(mib * MIB, abs=1)


# (config changes, context) -> (windowed layers, llama.cpp MiB)
PATTERN_TABLE: list[tuple[dict[str, Any], int, int, float]] = [
    ({}, 32768, 15, 111.0),
    # no layer_types and no period: Gemma 3's default, every sixth layer global
    ({"layer_types": None}, 32768, 15, 111.0),
    ({"layer_types": None, "sliding_window_pattern": 3}, 32768, 12, 6 * 32 + 12 * 1),
    ({"layer_types": None, "sliding_window_pattern": 1}, 32768, 0, 576.0),
    ({"layer_types": ["sliding_attention", "full_attention"] * 9}, 32768, 9, 9 * 32 + 9 * 1),
    # a window larger than the context: nothing to save
    ({"sliding_window": 4096}, 2048, 15, 36.0),
    ({"sliding_window": 4096}, 1000, 15, 18.0),
    # a window larger than the model's whole context: windowed layers hold the context
    ({"sliding_window": 65536}, 32768, 15, 576.0),
    # 1024-token window (Gemma 3 4B and up): 1536 cells on the windowed layers
    ({"sliding_window": 1024}, 32768, 15, 96 + 15 * 1.5),
    # no window at all
    ({"sliding_window": None, "layer_types": None}, 32768, 0, 576.0),
]


@pytest.mark.parametrize(("changes", "context", "windowed", "mib"), PATTERN_TABLE)
def test_window_pattern_from_the_config(
    tmp_path: Path, changes: dict[str, Any], context: int, windowed: int, mib: float
) -> None:
    spec = _spec(tmp_path, **changes)
    assert attention_layers(spec).windowed == windowed
    assert kv_cache_bytes(spec, context, target="llamacpp") == pytest.approx(mib * MIB, abs=1)


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("mistral", {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}),
        (
            "qwen2",
            {
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "max_window_layers": 0,
            },
        ),
        ("phi3", {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}),
    ],
)
def test_windows_llama_cpp_does_not_implement_count_the_whole_context(
    tmp_path: Path, family: str, config: dict[str, Any]
) -> None:
    """llama.cpp's llama (Mistral) and qwen2 graphs have no window and its phi3 graph
    disables it: the whole cache is allocated, so the whole cache is predicted."""
    spec = _spec(tmp_path, **config, layer_types=None, sliding_window=1024)
    assert spec.family == family and spec.sliding_window == 1024
    assert attention_layers(spec).windowed == 0
    for target in ("llamacpp", "openvino", "mlx", None):
        assert kv_cache_bytes(spec, 32768, target=target) == 18 * 32768 * 1024
    p = plan(spec, load_profile("x86-laptop-no-gpu"), Budgets(context=32768))
    assert any("no runtime edgekit plans for keeps only the window" in n for n in p.notes)


def test_quantized_kv_cache_scales_every_layer(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    f16 = kv_cache_bytes(spec, 32768, "f16", target="llamacpp")
    q8 = kv_cache_bytes(spec, 32768, "q8_0", target="llamacpp")
    assert q8 == pytest.approx(f16 * 34 / 64, abs=1)


def test_the_plan_predicts_the_windowed_cache_on_llama_cpp_only(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    p = plan(spec, load_profile("intel-core-ultra-7-258v-laptop"), Budgets(context=32768))
    kv = {(c.target, c.format): c.prediction.kv_cache_bytes for c in p.candidates}
    assert kv[("llamacpp", "Q8_0")] == kv_cache_bytes(spec, 32768, target="llamacpp") == 111 * MIB
    assert kv[("openvino", "INT8")] == 576 * MIB
    assert any("llamacpp keeps only the window" in n and "111 MiB" in n for n in p.notes)
    assert any(n.startswith("openvino: the whole context") for n in p.notes)
    # the decode step reads the window, not the padded cache: faster than the full read
    q8 = next(c for c in p.candidates if (c.target, c.format) == ("llamacpp", "Q8_0"))
    assert q8.prediction.decode_tok_s_full is not None and q8.prediction.decode_tok_s
    assert q8.prediction.decode_tok_s_full < q8.prediction.decode_tok_s


def test_load_admission_follows_the_target(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    on_ov = _kv_of_variant(spec, "openvino", 32768)
    on_llama = _kv_of_variant(spec, "llamacpp", 32768)
    assert (on_ov, on_llama) == (576 * MIB, 111 * MIB)


# --- GGUF: the key llama.cpp reads ------------------------------------------------------


def _gguf_kv(key: str, value: Any) -> bytes:
    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()

    if isinstance(value, bool):
        return s(key) + struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return s(key) + struct.pack("<II", 4, value)
    if isinstance(value, float):
        return s(key) + struct.pack("<If", 6, value)
    if isinstance(value, str):
        return s(key) + struct.pack("<I", 8) + s(value)
    if isinstance(value, list) and all(isinstance(v, bool) for v in value):
        return s(key) + struct.pack("<IIQ", 9, 7, len(value)) + bytes(map(int, value))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return s(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(map(s, value))
    if isinstance(value, list):  # int32s
        return s(key) + struct.pack(f"<IIQ{len(value)}i", 9, 5, len(value), *value)
    raise TypeError(value)


def gemma3_gguf(path: Path, layers: int = 6, **extra: Any) -> Path:
    """A header-complete Gemma 3 GGUF (F32 tensors, zero data) of ``layers`` layers."""
    meta: dict[str, Any] = {
        "general.architecture": "gemma3",
        "general.name": "tiny gemma3",
        "general.file_type": 0,
        "gemma3.context_length": 32768,
        "gemma3.embedding_length": 64,
        "gemma3.block_count": layers,
        "gemma3.feed_forward_length": 128,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.attention.sliding_window": 512,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(8)],
        **extra,
    }
    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (8, 64))]
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (64,)),
            (f"blk.{i}.attn_q.weight", (1024, 64)),
            (f"blk.{i}.attn_k.weight", (256, 64)),
            (f"blk.{i}.attn_v.weight", (256, 64)),
            (f"blk.{i}.attn_q_norm.weight", (256,)),
            (f"blk.{i}.attn_k_norm.weight", (256,)),
            (f"blk.{i}.attn_output.weight", (64, 1024)),
            (f"blk.{i}.post_attention_norm.weight", (64,)),
            (f"blk.{i}.ffn_norm.weight", (64,)),
            (f"blk.{i}.ffn_gate.weight", (128, 64)),
            (f"blk.{i}.ffn_up.weight", (128, 64)),
            (f"blk.{i}.ffn_down.weight", (64, 128)),
            (f"blk.{i}.post_ffw_norm.weight", (64,)),
        ]
    tensors.append(("output_norm.weight", (64,)))
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    out += b"".join(_gguf_kv(k, v) for k, v in meta.items())
    offset = 0
    for name, shape in tensors:
        dims = list(reversed(shape))
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 0, offset)
        n = 4
        for d in shape:
            n *= d
        offset += n + (-n % 32)
    out += b"\x00" * (-len(out) % 32)
    path.write_bytes(out + bytes(offset))
    return path


@pytest.mark.parametrize(
    ("extra", "windowed"),
    [
        ({}, 5),  # llama.cpp's default for gemma3: period 6
        ({"gemma3.attention.sliding_window_pattern": 2}, 3),
        ({"gemma3.attention.sliding_window_pattern": 0}, 6),  # llama.cpp: 0 = every layer
        ({"gemma3.attention.sliding_window_pattern": [True, False] * 3}, 3),
    ],
)
def test_window_pattern_from_the_gguf(tmp_path: Path, extra: dict[str, Any], windowed: int) -> None:
    spec = inspect_model(gemma3_gguf(tmp_path / "g.gguf", **extra))
    assert attention_layers(spec).windowed == windowed
    # as a llama.cpp variant, load's admission check windows it
    full = kv_cache_bytes(spec, 8192, target="openvino")
    windowed_kv = _kv_of_variant(spec, "llamacpp", 8192)
    cells = 6 * 8192 if windowed == 0 else (6 - windowed) * 8192 + windowed * 1024
    assert (full, windowed_kv) == (6 * 8192 * 1024, cells * 1024)


# --- the real allocation -----------------------------------------------------------------

_KV_LINE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers")


@pytest.mark.slow
def test_llamacpp_allocates_what_is_predicted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A random Gemma 3 with Gemma 3 270M's attention (18 layers, one KV head of 256,
    window 512), converted by edgekit and loaded by edgekit's llama.cpp target: the KV
    caches llama.cpp logs add up to the prediction at every context (111 MiB, not 576,
    at 32768)."""
    require("llama_cpp", "the allocation is llama.cpp's")
    require("torch", "the model is built with torch")
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from edgekit.targets.llamacpp import LlamaCppTarget
    from llamacpp_swa_kv import build_gguf

    gguf = build_gguf(tmp_path)
    spec = inspect_model(gguf)
    caplog.set_level(logging.DEBUG, logger="edgekit.llamacpp")
    for context in (512, 1000, 4096, 32768):
        caplog.clear()
        with LlamaCppTarget.load(gguf, context=context, threads=1) as session:
            assert session.info.settings.get("swa_full") is False
        caches = [
            (float(m.group(1)), int(m.group(3)))
            for r in caplog.records
            if (m := _KV_LINE.search(r.getMessage()))
        ]
        assert sum(layers for _, layers in caches) == 18, caches
        allocated = sum(mib for mib, _ in caches) * MIB
        predicted = kv_cache_bytes(spec, context, target="llamacpp")
        assert allocated == pytest.approx(predicted, rel=1e-3), context
    assert predicted == 111 * MIB
