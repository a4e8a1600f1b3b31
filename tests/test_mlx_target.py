"""The MLX target (targets/mlx.py, mlx_runtime.py, mlx_folder.py) on MLX's Linux CPU backend.

Greedy tokens equal mlx-lm's own generation and transformers' on the same F32 variant;
seeded sampling repeats; stop strings, cancel and close; logits against transformers;
hostile folders refused before mlx opens a file; the Metal memory cap refusal, on a
simulated Mac (a recorded 64 GB M-series device_info: nothing runs on Metal here); a q8_0
KV cache really is mlx-lm's QuantizedKVCache, its logits close to the unquantized cache's.

The contract suite (tests/contract/) covers the rest of the Session. The variants are
edgekit's conversions (converters/mlx) of tiny random models.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.errors import (
    InsufficientMemoryError,
    ModelFormatError,
    ModelNotFoundError,
    SettingError,
    TargetUnavailableError,
)
from tests.conftest import require

PROMPT = "It is a truth universally acknowledged, that a single man in possession"
GREEDY: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
# A 64 GB M-series Mac's Metal device_info, as MLX reports it (recorded on a real one).
MAC_64GB = {
    "architecture": "applegpu_g15s",
    "device_name": "Apple M3 Max",
    "max_recommended_working_set_size": 51539607552,
    "memory_size": 68719476736,
}


def _build(
    tmp_path_factory: pytest.TempPathFactory, quant: str, hidden: int = 64
) -> tuple[Path, Path]:
    require("mlx_lm", "the target runs mlx-lm")
    require("transformers", "the tiny model is built with transformers")
    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model("llama", tmp_path_factory.mktemp(f"hf-{hidden}"), hidden=hidden)
    out = tmp_path_factory.mktemp(f"mlx-{quant}-{hidden}") / "variant"
    convert_model(src, MlxTarget.format.name, out, quant=quant)
    return src, out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Llama's Hugging Face folder and its F32 variant (the parity reference)."""
    return _build(tmp_path_factory, "F32")


@pytest.fixture(scope="module")
def f32(built: tuple[Path, Path]) -> Path:
    return built[1]


@pytest.fixture(scope="module")
def source(built: tuple[Path, Path]) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with 64-wide heads: mlx-lm quantizes the KV cache in groups of 64."""
    return _build(tmp_path_factory, "F32", hidden=256)[1]


@pytest.fixture
def copy(f32: Path, tmp_path: Path) -> Path:
    """A copy of the F32 variant a test may damage."""
    return Path(shutil.copytree(f32, tmp_path / "variant"))


def _load(path: Path, **settings: Any) -> Any:
    from edgekit.targets.mlx import MlxTarget

    return MlxTarget.load(path, **settings)


# --- generation against mlx-lm and transformers ------------------------------------------


def _transformers_greedy(source: Path, ids: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


def _to_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """``tokens`` up to the first end-of-sequence token (not included)."""
    ends = [i for i, t in enumerate(tokens) if t in eos]
    return tokens[: ends[0]] if ends else tokens


def _step_greedy(variant: Path, ids: list[int], n: int) -> list[int]:
    """mlx-lm's generate_step alone: greedy, no end-of-sequence rule."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(variant)
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def _mlx_lm_greedy(variant: Path, ids: list[int], n: int) -> list[int]:
    """mlx-lm's own generation (``stream_generate``, what ``mlx_lm.generate`` runs: its
    loader, tokenizer wrapper and EOS rule) on the variant, greedy."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(variant))
    return [r.token for r in mlx_lm.stream_generate(model, tokenizer, ids, max_tokens=n)]


def test_greedy_tokens_equal_mlx_lm_and_transformers(f32: Path, source: Path) -> None:
    from edgekit.targets.mlx_folder import read_folder

    n = 24
    with _load(f32) as s:
        ids = s.tokenize(PROMPT)
        eos = set(read_folder(f32).eos_ids)
        mlx_tokens = _to_eos(_mlx_lm_greedy(f32, ids, n), eos)
        assert mlx_tokens == _to_eos(_transformers_greedy(source, ids, n), eos)
        stopping = s.generate(PROMPT, max_tokens=n, temperature=0.0)  # stops at an EOS
        assert stopping.completion_tokens == len(mlx_tokens)
        assert stopping.text == s.detokenize(mlx_tokens)
        forced = s.generate(PROMPT, max_tokens=n, **GREEDY)
        assert forced.completion_tokens == n
        assert forced.text == s.detokenize(_step_greedy(f32, ids, n))


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "phi3"])
def test_greedy_tokens_equal_transformers_on_every_family(
    family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Q/K/V biases (Qwen2), Q/K norms (Qwen3), fused projections (Phi-3) through the
    session. Gemma 3 is left to tests/test_mlx_convert.py: a tiny one with every layer
    windowed is a pattern mlx-lm cannot run, which the converter refuses."""
    require("mlx_lm", "the target runs mlx-lm")
    require("transformers", "the tiny model is built with transformers")
    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model(family, tmp_path_factory.mktemp(f"hf-{family}"))
    out = tmp_path_factory.mktemp(f"mlx-{family}") / "variant"
    convert_model(src, MlxTarget.format.name, out, quant="F32")
    with _load(out) as s:
        ids = s.tokenize(PROMPT)
        got = s.generate(PROMPT, max_tokens=16, temperature=0.0)  # both stop at an EOS
        want = _to_eos(_transformers_greedy(src, ids, 16), set(s._folder.eos_ids))
        path = list(ids)  # the session's greedy tokens, by its logits (the contract
        for _ in want:  # suite checks generation follows them)
            path.append(int(s.logits(path)[-1].argmax()))
        assert path[len(ids) :] == want
        assert got.completion_tokens == len(want)


def test_seeded_sampling_repeats_with_every_sampler_on(f32: Path) -> None:
    knobs = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repeat_penalty": 1.3}
    with _load(f32) as s:
        first = s.generate(PROMPT, max_tokens=24, seed=11, ignore_eos=True, **knobs)
        again = s.generate(PROMPT, max_tokens=24, seed=11, ignore_eos=True, **knobs)
        other = s.generate(PROMPT, max_tokens=24, seed=12, ignore_eos=True, **knobs)
    assert first == again
    assert first.text != other.text
    # a top_k of the whole vocabulary or more is no top_k (mlx-lm refuses such a k)
    with _load(f32) as s:
        whole = [s.generate(PROMPT, max_tokens=8, seed=3, top_k=k).text for k in (0, 512, 10**6)]
    assert whole[0] == whole[1] == whole[2]


def test_stop_cancel_and_close(f32: Path) -> None:
    s = _load(f32)
    full = s.generate(PROMPT, max_tokens=32, **GREEDY)
    stop = full.text[5:8]
    cut = s.generate(PROMPT, max_tokens=32, stop=[stop], **GREEDY)
    assert (cut.text, cut.finish_reason) == (full.text[: full.text.index(stop)], "stop")
    stream = s.stream(PROMPT, max_tokens=500, **GREEDY)
    next(stream)
    threading.Thread(target=s.cancel).start()
    rest = list(stream)
    assert rest[-1].finish_reason == "cancelled" and sum(c.tokens for c in rest) <= 2
    s.close()
    s.close()
    with pytest.raises(Exception, match="closed"):
        s.generate(PROMPT, max_tokens=2)


def test_logits_match_transformers(f32: Path, source: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with _load(f32, logits=True) as s:
        ids = s.tokenize(PROMPT + " " + PROMPT)
        got = s.logits(ids)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    assert got.dtype == np.float32 and got.shape == ref.shape == (len(ids), 512)
    assert float(np.abs(got - ref).max()) <= 1e-3 * float(np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_settings_and_devices(f32: Path) -> None:
    from edgekit.targets.mlx import MlxTarget

    with pytest.raises(SettingError, match="kv_cache"):
        _load(f32, kv_cache="q5_1")
    with pytest.raises(SettingError, match="kv_cache"):
        _load(f32, kv_cache="")  # not the default: only None is
    with pytest.raises(SettingError, match="context"):
        _load(f32, context=10**6)
    with pytest.raises(TargetUnavailableError, match="Metal"):
        _load(f32, device="gpu")  # Linux: MLX's default device is the CPU
    with _load(f32, context=64, **MlxTarget.device_settings("cpu")) as s:
        assert (s.info.unit, s.info.context_length, s.info.kv_cache) == ("cpu", 64, "f32")
    assert MlxTarget.load_unit("auto") == "cpu"


# --- the KV cache ----------------------------------------------------------------------------


def test_q8_kv_cache_is_quantized_and_close(wide: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_lm.models import cache as mlx_cache

    made: list[list[Any]] = []
    real = mlx_cache.make_prompt_cache

    def recording(model: Any, max_kv_size: int | None = None) -> list[Any]:
        made.append(real(model, max_kv_size))
        return made[-1]

    monkeypatch.setattr(mlx_cache, "make_prompt_cache", recording)
    with (
        _load(wide) as plain,
        _load(wide, kv_cache="q8_0") as q8,
        _load(wide, kv_cache="q4_0") as q4,
    ):
        assert (q8.info.kv_cache, q8.info.settings["kv_bits"]) == ("q8_0", 8)
        made.clear()
        q8.generate(PROMPT, max_tokens=4, **GREEDY)
        # generate_step swaps each layer's cache in place for its quantized form
        assert made and all(isinstance(c, mlx_cache.QuantizedKVCache) for c in made[-1])
        assert {c.bits for c in made[-1]} == {8} and {c.group_size for c in made[-1]} == {64}
        made.clear()
        plain.generate(PROMPT, max_tokens=4, **GREEDY)
        assert made and all(type(c) is mlx_cache.KVCache for c in made[-1])
        ids = plain.tokenize(PROMPT + " " + PROMPT)
        ref, l8, l4 = plain.logits(ids), q8.logits(ids), q4.logits(ids)
    scale = float(np.abs(ref).max())
    e8, e4 = float(np.abs(l8 - ref).max()), float(np.abs(l4 - ref).max())
    assert 0 < e8 <= 0.05 * scale  # the cache is quantized, and 8 bits stay close
    assert e4 > e8  # 4 bits lose more
    assert (l8.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_the_recorded_kv_cache_is_the_default(wide: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(wide, tmp_path / "variant"))
    recorded = json.loads((folder / "edgekit.json").read_text())
    (folder / "edgekit.json").write_text(json.dumps({**recorded, "kv_cache": "q8_0"}))
    with _load(folder) as s:
        assert (s.info.kv_cache, s.info.settings["kv_bits"]) == ("q8_0", 8)
    with _load(folder, kv_cache="f16") as s:  # a setting overrides it
        assert s.info.settings["kv_bits"] is None
    (folder / "edgekit.json").write_text(json.dumps({**recorded, "kv_cache": "q9"}))
    with pytest.raises(ModelFormatError, match="kv_cache"):
        _load(folder)


def test_a_quantized_cache_needs_whole_groups(f32: Path) -> None:
    with pytest.raises(SettingError, match="groups of 64"):
        _load(f32, kv_cache="q8_0")  # the tiny model's heads are 16 wide


# --- hostile folders -------------------------------------------------------------------------


def _config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _symlinked_weights(folder: Path) -> None:
    outside = folder.parent / "elsewhere.safetensors"
    (folder / "model.safetensors").rename(outside)
    (folder / "model.safetensors").symlink_to(outside)


def _index_outside(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: "../model.safetensors" for k in index["weight_map"]}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _lying_header(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 4)
    path.write_bytes(bytes(data))


HOSTILE = {
    "symlinked weights": (_symlinked_weights, "link"),
    "index outside": (_index_outside, "model folder"),
    "huge config": (
        lambda f: (f / "config.json").write_bytes(b'{"a": "' + b"x" * (5 << 20) + b'"}'),
        "larger",
    ),
    "malformed config": (lambda f: (f / "config.json").write_text("{'model_type': "), "JSON"),
    "model_type path": (lambda f: _config(f, model_type="../x"), "model_type"),
    "model_type dotted": (lambda f: _config(f, model_type="llama.evil"), "model_type"),
    "model_file": (lambda f: _config(f, model_file="evil.py"), "model_file"),
    "bits 7": (
        lambda f: _config(f, quantization={"bits": 7, "group_size": 64, "mode": "affine"}),
        "bits",
    ),
    "group 1000": (
        lambda f: _config(f, quantization={"bits": 4, "group_size": 1000, "mode": "affine"}),
        "group_size",
    ),
    "unknown module": (
        lambda f: _config(f, quantization={"bits": 4, "group_size": 64, "model.nope": {"bits": 8}}),
        "do not hold",
    ),
    "legacy awq": (
        lambda f: _config(f, quantization_config={"quant_method": "awq", "bits": 4}),
        "quantization_config",
    ),
    "lying header": (_lying_header, "model.safetensors"),
    "extra weights": (
        lambda f: shutil.copy(f / "model.safetensors", f / "model-extra.safetensors"),
        "index names",
    ),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json"),
    "huge layers": (lambda f: _config(f, num_hidden_layers=10**9), "num_hidden_layers"),
}


def _tensors(folder: Path, change: Any) -> None:
    """Rewrite model.safetensors' header by ``change(header)`` (the data kept; the
    header's offsets are what it says, so a change keeps the tiling consistent)."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])


def _retype(name: str, dtype: str, width: int) -> Any:
    """Give tensor ``name`` ``dtype`` (``width`` bytes an element) over the same bytes."""

    def change(header: dict[str, Any]) -> None:
        t = header[name]
        start, end = t["data_offsets"]
        rows = t["shape"][0]
        t["dtype"], t["shape"] = dtype, [rows, (end - start) // width // rows]

    return change


def _quant(folder: Path, **entries: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    for c in (config["quantization"], config.get("quantization_config")):
        if c is not None:
            c.update(entries)
    (folder / "config.json").write_text(json.dumps(config))


def _wide_tokenizer(folder: Path) -> None:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append(
        {
            "id": vocab + 5,
            "content": "<beyond>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


HOSTILE_F32 = {
    "f64 tensor": (lambda f: _tensors(f, _retype("model.norm.weight", "F64", 8)), "F64"),
    "rope_theta string": (lambda f: _config(f, rope_theta="10000"), "rope_theta"),
    "rms_norm_eps bool": (lambda f: _config(f, rms_norm_eps=True), "rms_norm_eps"),
    "generation_config list": (
        lambda f: (f / "generation_config.json").write_text("[1, 2]"),
        "not an object",
    ),
    "edgekit.json list": (lambda f: (f / "edgekit.json").write_text("[]"), "not an object"),
    "tokenizer past vocab": (_wide_tokenizer, "vocab_size"),
    "more layers": (lambda f: _config(f, num_hidden_layers=3), "num_hidden_layers"),
    "smaller vocab": (lambda f: _config(f, vocab_size=256), "make it [256, 64]"),
    "tied with a head": (lambda f: _config(f, tie_word_embeddings=True), "lm_head"),
    "head_dim": (lambda f: _config(f, head_dim=8), "self_attn"),
    "qwen3 layout": (lambda f: _config(f, model_type="qwen3"), "q_norm"),
}
HOSTILE_Q4 = {
    "bits float": (lambda f: _quant(f, bits=4.0), "bits"),
    "bits true": (lambda f: _quant(f, bits=True), "bits"),
    "group float": (lambda f: _quant(f, group_size=64.0), "group_size"),
    "module true": (lambda f: _quant(f, lm_head=True), "not an object or false"),
    "norm entry": (lambda f: _quant(f, **{"model.norm": {"bits": 4, "group_size": 64}}), "norm"),
    "other bits": (lambda f: _quant(f, bits=8), "embed_tokens"),
    "other group": (lambda f: _quant(f, group_size=32), "scales"),
    "module 8-bit": (lambda f: _quant(f, lm_head={"bits": 8, "group_size": 64}), "lm_head"),
    "module false": (lambda f: _quant(f, lm_head=False), "lm_head"),
    "packed f32": (
        lambda f: _tensors(f, _retype("model.layers.0.self_attn.q_proj.weight", "F32", 4)),
        "q_proj",
    ),
    "scales i32": (
        lambda f: _tensors(f, _retype("model.layers.0.self_attn.q_proj.scales", "I32", 4)),
        "I32",
    ),
    "scales f16": (
        lambda f: _tensors(f, _retype("model.layers.0.self_attn.q_proj.scales", "F16", 2)),
        "F16",
    ),
    "swapped shape": (
        lambda f: _tensors(
            f,
            lambda h: h["model.layers.0.self_attn.q_proj.weight"].update(
                shape=h["model.layers.0.self_attn.q_proj.weight"]["shape"][::-1]
            ),
        ),
        "q_proj",
    ),
}


@pytest.fixture(scope="module")
def q4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's 4-bit variant (group 64): packed U32 weights, F32 scales."""
    return _build(tmp_path_factory, "4BIT")[1]


@pytest.mark.parametrize("damage", list(HOSTILE_Q4), ids=list(HOSTILE_Q4))
def test_hostile_quantized_folder_is_refused_before_mlx_opens_it(
    q4: Path, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(shutil.copytree(q4, tmp_path / "variant"))
    _refused_before_mlx(folder, *HOSTILE_Q4[damage], monkeypatch)


@pytest.mark.parametrize("damage", [*HOSTILE, *HOSTILE_F32], ids=[*HOSTILE, *HOSTILE_F32])
def test_hostile_folder_is_refused_before_mlx_opens_it(
    copy: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refused_before_mlx(copy, *{**HOSTILE, **HOSTILE_F32}[damage], monkeypatch)


def test_the_quantized_variant_loads(q4: Path) -> None:
    with _load(q4) as session:
        assert session.info.vocab_size > 0


def _refused_before_mlx(
    copy: Path, change: Any, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx_lm.utils

    change(copy)
    imported: list[str] = []
    real_import = importlib.import_module

    def watch(name: str, package: str | None = None) -> Any:
        imported.append(name)
        return real_import(name, package)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("mlx_lm loaded a hostile folder")

    monkeypatch.setattr(importlib, "import_module", watch)
    monkeypatch.setattr(mlx_lm.utils, "load_model", never)
    with pytest.raises(ModelFormatError) as info:
        _load(copy)
    assert said in info.value.message, info.value.message
    assert info.value.hint
    assert not [m for m in imported if m.startswith("mlx_lm.models.")], imported


def test_not_a_folder(tmp_path: Path) -> None:
    require("mlx_lm", "the target runs mlx-lm")
    with pytest.raises(ModelNotFoundError):
        _load(tmp_path / "missing")


# --- memory: Metal's working-set cap on a simulated Mac --------------------------------------


@pytest.fixture
def mac(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a 64 GB Apple silicon Mac as far as the target asks (platform and
    MLX's Metal device_info and default device): a refusal test only, no Metal runs."""
    require("mlx", "the target asks MLX for Metal's working set")
    import platform

    import mlx.core as mx

    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(mx, "device_info", lambda d=None: dict(MAC_64GB))
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))


def test_memory_caps() -> None:
    from edgekit.targets.mlx import MlxTarget

    from edgekit.devices import load_profile

    mac, iphone = load_profile("macbook-pro-m3-max"), load_profile("iphone-16-pro")
    cap = MlxTarget.memory_cap(mac, "gpu", 64 << 30)
    assert cap is not None and cap.bytes == int(0.9 * (64 << 30))
    assert "iogpu.wired_limit_mb" in cap.hint
    assert MlxTarget.memory_cap(mac, "cpu", 64 << 30) is None
    # iOS: the app's own limit, which the profile's figure already is (no mlx-lm there)
    assert MlxTarget.memory_cap(iphone, "gpu", 5 << 30) is None
    assert MlxTarget.host_memory_cap("gpu") is None  # Linux: no Metal


def _sparse_variant(f32: Path, folder: Path, gib: int) -> Path:
    """The tiny variant with a sparse tensor of ``gib`` GiB added after its own (which
    keep the folder consistent with its config): a real file of that size on disk,
    without the disk."""
    folder = Path(shutil.copytree(f32, folder))
    (folder / "model.safetensors.index.json").unlink()
    path = folder / "model.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    end = max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
    count = (gib << 30) // 4
    header["padding.weight"] = {
        "dtype": "F32",
        "shape": [count],
        "data_offsets": [end, end + 4 * count],
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + n : 8 + n + end])
        f.truncate(8 + len(text) + end + 4 * count)
    return folder


def test_a_variant_over_the_metal_cap_is_refused_before_loading(
    f32: Path, tmp_path: Path, mac: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx_lm.utils
    from edgekit.targets.mlx import MlxTarget

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the refusal must come before mlx loads a tensor")

    monkeypatch.setattr(mlx_lm.utils, "load_model", never)
    cap = MlxTarget.host_memory_cap("gpu")
    assert cap is not None and cap.bytes == int(0.9 * 51539607552)
    assert MlxTarget.load_unit("auto") == "gpu"
    big = _sparse_variant(f32, tmp_path / "big", 48)
    with pytest.raises(InsufficientMemoryError) as info:
        MlxTarget.load(big)
    said = f"{info.value.message} {info.value.hint}"
    assert "48.00 GiB of weights" in said and "43.20 GiB" in said, said
    assert "sudo sysctl iogpu.wired_limit_mb=N" in said


def test_a_variant_under_the_metal_cap_passes_the_check(f32: Path, mac: None) -> None:
    from edgekit.targets.mlx import MlxTarget, check_memory
    from edgekit.targets.mlx_folder import read_folder

    folder = read_folder(f32)
    check_memory(folder, 1024, None, MlxTarget.host_memory_cap("gpu"))  # no error
    assert os.path.getsize(f32 / "model.safetensors") < 1 << 20
