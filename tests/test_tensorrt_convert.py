"""The TensorRT Edge-LLM export: HF folder -> the Edge-LLM ONNX export + engine.json.

The export runs NVIDIA's exporter from its isolated tool environment (``edgekit tools
install tensorrt-export``; .ci/setup creates it in the default location). Where it is
absent the export tests skip with the precise reason; the refusals, the settings and the
folder checks run everywhere. The exported graph cannot be run here (its attention is
the custom op trt_edgellm::AttentionPlugin, for TensorRT only): the tests check what can
be checked without TensorRT, that every weight of the source reached the export intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters import convert
from edgekit.converters.recipe import Recipe
from edgekit.converters.tensorrt import FORMAT
from edgekit.converters.tensorrt.edges import EXPORT_FAMILIES
from edgekit.converters.tensorrt.export import failure_summary
from edgekit.converters.tensorrt.folder import ENGINE_JSON_BYTES, read_export
from edgekit.converters.tensorrt.settings import (
    EDGELLM_VERSION,
    ENGINE_JSON,
    EngineSettings,
    settings_from_recipe,
)
from edgekit.converters.tensorrt.socs import CHIPS, chip, precisions_for
from edgekit.converters.tensorrt.tool_env import EXPORT_ENV

from edgekit.architectures import dimensions_from_config, expected_tensors, family_for_hf
from edgekit.errors import (
    ConversionError,
    ModelError,
    ModelFormatError,
    TargetUnavailableError,
    UnsupportedConversionError,
)
from edgekit.inspection import inspect_model
from edgekit.tool_envs import TOOLS_DIR_ENV, status
from tests.builders import external_data_graph, tiny_config, write_hf_folder
from tests.conftest import STRICT, require

# --- the precision table and the settings ---------------------------------------------------


def test_the_precision_table_follows_the_sm_rules() -> None:
    assert precisions_for("orin") == ("F16", "INT8", "INT4")  # no FP8 on an Orin
    assert precisions_for("GA102") == ("F16", "INT8", "INT4")
    assert precisions_for("AD102") == ("F16", "INT8", "INT4", "FP8")
    assert precisions_for("GH100") == ("F16", "INT8", "INT4", "FP8")
    assert precisions_for("THOR") == ("F16", "INT8", "INT4", "FP8", "NVFP4")
    assert precisions_for("GB202") == ("F16", "INT8", "INT4", "FP8", "NVFP4")
    assert {c.key: c.sm for c in CHIPS.values()} == {
        "ORIN": 87,
        "THOR": 110,
        "GA102": 86,
        "AD102": 89,
        "GB202": 120,
        "GH100": 90,
    }
    assert all("cuda-gpus" in c.source and "Edge-LLM" in c.source for c in CHIPS.values())
    with pytest.raises(ModelError, match="'XAVIER'") as e:
        chip("XAVIER")
    assert "ORIN" in e.value.hint and "GH100" in e.value.hint


def test_the_format_builds_f16_and_plans_the_rest() -> None:
    assert FORMAT.buildable and [e.output for e in FORMAT.edges()] == ["tensorrt"]
    assert list(FORMAT.quants) == ["F16", "INT8", "INT4", "FP8", "NVFP4"]
    assert FORMAT.default_quant == "F16" and FORMAT.quant_not_built("f16") == ""
    for q in ("INT8", "int4", "FP8", "NVFP4"):
        assert "ModelOpt calibration on a CUDA GPU" in FORMAT.quant_not_built(q)
    assert FORMAT.tool_envs == (EXPORT_ENV,)
    bits = {q.name: q.bits_per_weight for q in FORMAT.quants.values()}
    assert bits == {"F16": 16.0, "INT8": 8.0, "INT4": 4.125, "FP8": 8.0, "NVFP4": 4.5}


def test_the_requirements_pin_the_settings_version() -> None:
    pins = EXPORT_ENV.requirements.read_text().split()
    assert pins == ["torch==2.13.0", f"tensorrt-edgellm[export]=={EDGELLM_VERSION}"]


def _spec(tmp_path: Path, family: str = "llama", **overrides: Any) -> Any:
    return inspect_model(_fake_hf(tmp_path / family, family, **overrides))


def _fake_hf(folder: Path, family: str, *, template: bool = True, **overrides: Any) -> Path:
    """A Hugging Face folder of zero weights (only shapes are read by the checks)."""
    config = tiny_config(family, **overrides)
    fam = family_for_hf(family)
    dims = dimensions_from_config(config, fam, "t")
    tensors = {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}
    write_hf_folder(folder, config, tensors)
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    if template:
        (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def test_settings_defaults_fit_the_model(tmp_path: Path) -> None:
    spec = _spec(tmp_path)  # context 2048
    s = settings_from_recipe("f16", None, spec)
    assert (s.max_batch_size, s.max_input_len, s.max_output_len) == (1, 1536, 512)
    assert s.max_kv_cache_capacity == 2048 and s.kv_cache_type == "fp16" and s.soc is None
    r = Recipe(weights="F16", soc="orin")
    object.__setattr__(r, "max_batch", 4)  # the recipe options the lead adds to Recipe
    object.__setattr__(r, "max_input", 1024)
    object.__setattr__(r, "max_output", 256)
    s = settings_from_recipe("F16", r, spec)
    assert s.to_json() == {
        "schema": 1,
        "precision": "F16",
        "max_batch_size": 4,
        "max_input_len": 1024,
        "max_output_len": 256,
        "max_kv_cache_capacity": 1280,
        "kv_cache_type": "fp16",
        "soc": "ORIN",
        "edgellm_version": EDGELLM_VERSION,
    }
    assert EngineSettings.from_json(s.to_json(), "engine.json") == s


@pytest.mark.parametrize(
    ("options", "quant", "message"),
    [
        ({"max_batch": 9}, "F16", "max_batch=9 is out of range"),
        ({"max_batch": 0}, "F16", "max_batch=0 is out of range"),
        ({"max_input": 8}, "F16", "max_input=8 is out of range"),
        ({"max_output": 40000}, "F16", "max_output=40000 is out of range"),
        ({"max_input": 2000, "max_output": 100}, "F16", "2100 tokens is more than"),
        ({"kv_cache": "fp8"}, "F16", "FP8 KV cache needs SM89"),
        ({"kv_cache": "q8_0"}, "F16", "no KV-cache type 'q8_0'"),
        ({"soc": "ORIN"}, "FP8", "does not run TensorRT Edge-LLM FP8"),
        ({"soc": "AD102"}, "NVFP4", "does not run TensorRT Edge-LLM NVFP4"),
        ({"soc": "XAVIER"}, "F16", "no precision table row"),
        ({}, "Q4_K_M", "no precision 'Q4_K_M'"),
    ],
)
def test_settings_refusals(
    tmp_path: Path, options: dict[str, Any], quant: str, message: str
) -> None:
    r = Recipe(weights=quant, kv_cache=options.pop("kv_cache", "f16"), soc=options.pop("soc", None))
    for key, value in options.items():
        object.__setattr__(r, key, value)
    with pytest.raises(UnsupportedConversionError, match=message):
        settings_from_recipe(quant, r, _spec(tmp_path))


def _good_settings() -> dict[str, Any]:
    return {
        "schema": 1,
        "precision": "F16",
        "max_batch_size": 1,
        "max_input_len": 512,
        "max_output_len": 512,
        "max_kv_cache_capacity": 1024,
        "kv_cache_type": "fp16",
        "soc": "ORIN",
        "edgellm_version": EDGELLM_VERSION,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "unknown extra"),
        ({"soc": None, "max_kv_cache_capacity": 1025}, "is not max_input_len"),
        ({"max_batch_size": True}, "max_batch_size is True"),
        ({"max_input_len": 1.5}, "max_input_len is 1.5"),
        ({"precision": "FP8"}, "ORIN does not run FP8"),
        ({"precision": "Q4"}, "precision is 'Q4'"),
        ({"kv_cache_type": "fp8"}, "kv_cache_type is 'fp8'"),
        ({"soc": "XAVIER"}, "soc is 'XAVIER'"),
        ({"edgellm_version": "0.12.0"}, "edgellm_version is '0.12.0'"),
        ({"schema": 2}, "schema 2 is not 1"),
    ],
)
def test_engine_json_is_read_strictly(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelFormatError, match=message):
        EngineSettings.from_json({**_good_settings(), **change}, "engine.json")
    missing = _good_settings()
    del missing["soc"]
    with pytest.raises(ModelFormatError, match="missing soc"):
        EngineSettings.from_json(missing, "engine.json")
    with pytest.raises(ModelFormatError, match="not a JSON object"):
        EngineSettings.from_json([1], "engine.json")


# --- refusals before anything is written ----------------------------------------------------


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "no-tools"))
    return tmp_path / "no-tools"


@pytest.mark.parametrize(
    ("family", "quant", "recipe", "error", "message"),
    [
        ("mistral", None, None, UnsupportedConversionError, "lists no support for Mistral"),
        ("llama", "INT4", None, UnsupportedConversionError, "ModelOpt calibration"),
        ("llama", "NVFP4", None, UnsupportedConversionError, "ModelOpt calibration"),
        ("llama", "Q8_0", None, UnsupportedConversionError, "no precision 'Q8_0'"),
        ("llama", None, "soc=XAVIER", UnsupportedConversionError, "no precision table row"),
        ("llama", None, "group_size=64", UnsupportedConversionError, "cannot express group_size"),
        ("qwen3", None, "kv_cache=q8_0", UnsupportedConversionError, "no KV-cache type"),
        ("qwen2", None, None, TargetUnavailableError, "tool environment tensorrt-export"),
    ],
)
def test_refusals_come_before_writing(
    tmp_path: Path,
    no_tools: Path,
    family: str,
    quant: str | None,
    recipe: str | None,
    error: type[Exception],
    message: str,
) -> None:
    src = _fake_hf(tmp_path / "src", family)
    out = tmp_path / "out"
    with pytest.raises(error, match=message) as e:
        convert.convert_model(src, "tensorrt", out, quant=quant, recipe=recipe)
    if error is TargetUnavailableError:
        assert e.value.hint == "edgekit tools install tensorrt-export"  # type: ignore[attr-defined]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("dtype", ["F8_E4M3", "I64", "F64", "I8"])
def test_weights_of_another_dtype_are_refused_before_writing(
    tmp_path: Path, no_tools: Path, dtype: str
) -> None:
    """An FP8 or integer checkpoint (its scales elsewhere) would be cast blindly into a
    wrong model: refused, naming the tensor, before anything is written."""
    config = tiny_config("qwen3")
    fam = family_for_hf("qwen3")
    dims = dimensions_from_config(config, fam, "t")
    tensors = {
        t.name: (t.shape, dtype if "mlp" in t.name else "BF16") for t in expected_tensors(fam, dims)
    }
    src = tmp_path / "src"
    write_hf_folder(src, config, tensors)
    (src / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (src / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(UnsupportedConversionError, match=f"mlp.* is {dtype}; the Edge-LLM"):
        convert.convert_model(src, "tensorrt", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_source_without_a_chat_template_is_refused(tmp_path: Path, no_tools: Path) -> None:
    src = _fake_hf(tmp_path / "src", "llama", template=False)
    with pytest.raises(UnsupportedConversionError, match="no chat template"):
        convert.convert_model(src, "tensorrt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_failure_summary_quotes_the_exception_not_the_traceback() -> None:
    tail = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "\x1b[96m*torch.export*\x1b[0m component",
        "## Exception summary",
        "",
        "<class 'TypeError'>: FP16Linear expects float16 input, got torch.float32",
        "",
        "(Refer to the full stack trace above for more information.)",
    ]
    assert failure_summary(tail) == (
        "<class 'TypeError'>: FP16Linear expects float16 input, got torch.float32"
    )
    assert failure_summary(["a", "ValueError: model_type='x' does not provide", "rc"]) == (
        "ValueError: model_type='x' does not provide"
    )
    assert failure_summary(["one", "last \x1b[1mline\x1b[0m", ""]) == "last line"


def test_an_f32_source_is_staged_at_f16(tmp_path: Path) -> None:
    """The exporter fails on an f32 Qwen2 (FP16Linear expects float16 input): such a
    source is cast to f16 first, values rounded to nearest, other dtypes kept."""
    np = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from edgekit.converters.tensorrt.staging import needs_staging, stage_f16

    src = tmp_path / "src"
    src.mkdir()
    w = np.array([[1.0, 1 / 3, -2.5e-8, 65504.0]], dtype=np.float32)
    ids = np.array([1, 2, 3], dtype=np.int64)
    safetensors_numpy.save_file({"w": w, "ids": ids}, str(src / "model.safetensors"))
    (src / "config.json").write_text('{"model_type": "qwen2", "torch_dtype": "float32"}')
    (src / "tokenizer.json").write_text('{"t": 1}')
    (src / "modeling_evil.py").write_text("import os")
    assert needs_staging(src)
    out = stage_f16(src, tmp_path / "staged")
    staged = safetensors_numpy.load_file(str(out / "model.safetensors"))
    assert (
        staged["w"].dtype == np.float16 and staged["w"].tobytes() == w.astype(np.float16).tobytes()
    )
    assert staged["ids"].tobytes() == ids.tobytes()
    config = json.loads((out / "config.json").read_text())
    assert (config["dtype"], config["torch_dtype"]) == ("float16", "float16")
    assert (out / "tokenizer.json").read_text() == '{"t": 1}'
    assert not (out / "modeling_evil.py").exists() and not needs_staging(out)
    safetensors_numpy.save_file({"w": w * 2}, str(src / "model.safetensors"))
    with pytest.raises(UnsupportedConversionError, match="beyond f16's range"):
        stage_f16(src, tmp_path / "staged2")


def test_a_bf16_or_f32_weight_beyond_f16_is_refused_even_beside_an_inf(tmp_path: Path) -> None:
    """bf16 shares f32's range: the exporter would cast 1e5 to an F16 inf without a word.
    An f32 tensor already holding an inf must not hide another element's overflow."""
    np = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from edgekit.converters.tensorrt.staging import stage_f16

    def source(name: str, tensors: dict[str, Any]) -> Path:
        src = tmp_path / name
        src.mkdir()
        safetensors_numpy.save_file(tensors, str(src / "model.safetensors"))
        (src / "config.json").write_text('{"model_type": "qwen2"}')
        return src

    def bf16_source(name: str, values: list[float]) -> Path:
        # bf16 bits are the f32's upper half (exact for these values); numpy has no bf16,
        # so the file is written by hand with dtype BF16
        bits = (np.array(values, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
        header = {"w": {"dtype": "BF16", "shape": [len(values)], "data_offsets": [0, bits.nbytes]}}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        src = tmp_path / name
        src.mkdir()
        (src / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bits.tobytes())
        (src / "config.json").write_text('{"model_type": "qwen2"}')
        return src

    # -65280: the largest bf16 below f16's max; an inf passes as the inf it is
    out = stage_f16(bf16_source("ok", [1.0, -65280.0, float("inf")]), tmp_path / "staged-ok")
    assert (out / "model.safetensors").is_file()
    with pytest.raises(UnsupportedConversionError, match="w: values beyond f16's range"):
        stage_f16(bf16_source("big", [1.0, 65536.0]), tmp_path / "staged-big")
    both = np.array([float("inf"), 1e6], dtype=np.float32)
    with pytest.raises(UnsupportedConversionError, match="beyond f16's range"):
        stage_f16(source("inf", {"w": both}), tmp_path / "staged-inf")


def test_the_check_computes_the_settings_the_run_will(tmp_path: Path) -> None:
    """A pack's context beyond the builder's 32,768-token prompt bound is clamped, the same
    in the check and the run (it passed the check, then failed after the dequantization)."""
    from edgekit.converters.tensorrt.settings import INPUT, settings_from_recipe

    spec = _spec(tmp_path, "qwen3", max_position_embeddings=131072)
    settings = settings_from_recipe("F16", None, spec, context=40000)
    assert settings.max_input_len == INPUT[1] and settings.max_output_len == 512
    assert settings.max_kv_cache_capacity <= 40000


# --- hostile export folders -----------------------------------------------------------------


def _write_export(root: Path, config: dict[str, Any] | None = None) -> Path:
    """A structurally valid variant folder (a one-node graph over model.onnx.data; the
    tokenizer files are not tokenizers)."""
    from tests.builders import safetensors_bytes

    llm = root / "llm"
    llm.mkdir(parents=True)
    conf = {
        "model": "qwen3",
        "engine_role": "llm",
        "edgellm_version": EDGELLM_VERSION,
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 2048,
        "kv_cache_dtype": "fp16",
    }
    (llm / "config.json").write_text(json.dumps(config if config is not None else conf))
    (llm / "embedding.safetensors").write_bytes(
        safetensors_bytes({"embedding": ((256, 64), "F16")})
    )
    external_data_graph(llm, b"\0" * 64)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (llm / name).write_bytes(b"{}")
    (llm / "chat_template.jinja").write_text("{{ messages }}")
    (root / ENGINE_JSON).write_text(json.dumps(_good_settings()))
    return root


def test_a_valid_export_folder_reads(tmp_path: Path) -> None:
    folder = read_export(_write_export(tmp_path / "v"))
    assert folder.settings.soc == "ORIN" and folder.config["hidden_size"] == 64
    assert folder.data_bytes == 64 and folder.onnx_bytes > 0


def _hostile(root: Path, how: str) -> None:
    llm = root / "llm"
    if how == "symlink":
        (llm / "tokenizer.json").unlink()
        (llm / "tokenizer.json").symlink_to(root / ENGINE_JSON)
    elif how == "fifo":
        (llm / "model.onnx.data").unlink()
        os.mkfifo(llm / "model.onnx.data")
    elif how == "huge config":
        (llm / "config.json").write_bytes(b" " * ((1 << 20) + 1))
    elif how == "config not an object":
        (llm / "config.json").write_text("[1, 2]")
    elif how == "missing":
        (llm / "model.onnx").unlink()
    elif how == "stray":
        (llm / "run.sh").write_text("echo")
    elif how == "stray at the root":
        (root / "etc").symlink_to("/etc")
    elif how == "dims":
        conf = json.loads((llm / "config.json").read_text())
        (llm / "config.json").write_text(json.dumps({**conf, "hidden_size": 128}))
    elif how == "engine extra":
        (root / ENGINE_JSON).write_text(json.dumps({**_good_settings(), "plugin_path": "/x"}))
    elif how == "engine huge":
        (root / ENGINE_JSON).write_bytes(b" " * (ENGINE_JSON_BYTES + 1))
    elif how == "context":
        conf = json.loads((llm / "config.json").read_text())
        (llm / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 1000}))
    elif how == "nan":
        (llm / "config.json").write_text('{"vocab_size": NaN}')
    elif how == "kv dtype":
        conf = json.loads((llm / "config.json").read_text())
        (llm / "config.json").write_text(json.dumps({**conf, "kv_cache_dtype": "fp8"}))
    elif how in GRAPHS:
        external_data_graph(llm, b"\0" * 64, **GRAPHS[how])
    elif how == "not a graph":
        (llm / "model.onnx").write_bytes(b"\xff" * 40)


# external-data paths a hostile graph could give the engine builder to read
GRAPHS: dict[str, dict[str, Any]] = {
    "data outside": {"location": "../../../etc/passwd"},
    "data absolute": {"location": "/home/user/.ssh/id_rsa"},
    "data elsewhere": {"location": "tokenizer.json"},
    "data past its end": {"length": 128},
}


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("symlink", "tokenizer.json: is a symbolic link"),
        ("fifo", "not a regular file"),
        ("huge config", "more than the 1,048,576 allowed"),
        ("config not an object", "is not a JSON object"),
        ("missing", "missing model.onnx"),
        ("stray", "run.sh: is not a file of an Edge-LLM export"),
        ("stray at the root", "etc: is a symbolic link that is not part of an Edge-LLM variant"),
        ("dims", r"holds embedding \[256, 64\], not one tensor of \[256, 128\]"),
        ("engine extra", "unknown plugin_path"),
        ("engine huge", "larger than the 65,536 bytes allowed"),
        ("context", "a KV cache of 1024 tokens is more than the model's 1,000"),
        ("nan", "NaN"),
        ("kv dtype", "kv_cache_dtype 'fp8' is not engine.json's fp16"),
        ("data outside", r"keeps its data in '\.\./\.\./\.\./etc/passwd', not model.onnx.data"),
        ("data absolute", r"keeps its data in '/home/user/\.ssh/id_rsa'"),
        ("data elsewhere", "keeps its data in 'tokenizer.json'"),
        ("data past its end", "reads bytes 0..128 of model.onnx.data, which holds 64"),
        ("not a graph", "not an ONNX model"),
    ],
)
def test_hostile_export_folders_are_refused(tmp_path: Path, how: str, message: str) -> None:
    root = _write_export(tmp_path / "v")
    _hostile(root, how)
    with pytest.raises(ModelFormatError, match=message) as e:
        read_export(root)
    assert "edgekit convert MODEL --to tensorrt" in e.value.hint


def test_an_export_must_describe_its_source(tmp_path: Path) -> None:
    from edgekit.converters.tensorrt.folder import check_matches

    spec = _spec(tmp_path, "qwen3")  # vocab 256, hidden 64, 2 layers, 4/2 heads of 32
    root = _write_export(tmp_path / "v")
    check_matches(read_export(root), spec)
    conf = json.loads((root / "llm" / "config.json").read_text())
    (root / "llm" / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 3}))
    with pytest.raises(ModelFormatError, match=r"num_hidden_layers 3 \(source 2\)"):
        check_matches(read_export(root), spec)


def test_a_linked_llm_folder_is_refused(tmp_path: Path) -> None:
    real = _write_export(tmp_path / "real")
    root = tmp_path / "v"
    root.mkdir()
    (root / "llm").symlink_to(real / "llm")
    (root / ENGINE_JSON).write_text(json.dumps(_good_settings()))
    with pytest.raises(ModelFormatError, match="is a symbolic link, not a folder"):
        read_export(root)


def test_the_export_digest_covers_every_byte_of_the_weights(tmp_path: Path) -> None:
    """A fine-tune that changes weights anywhere (a merged LoRA) is another export: its
    digest differs, so the engine cache never reuses the other model's engine."""
    from edgekit.converters.tensorrt.folder import MEMO_MIN, export_digest

    root = _write_export(tmp_path / "v")
    data = root / "llm" / "model.onnx.data"
    blob = bytearray(os.urandom(MEMO_MIN + (1 << 20)))
    data.write_bytes(blob)
    first = export_digest(read_export(root))
    assert export_digest(read_export(root)) == first  # the same bytes, the same digest
    for offset in (len(blob) // 4, len(blob) * 3 // 4):  # beyond start, middle and end
        blob[offset] ^= 0xFF
        data.write_bytes(blob)
        changed = export_digest(read_export(root))
        assert changed != first
        blob[offset] ^= 0xFF
        data.write_bytes(blob)
        assert export_digest(read_export(root)) == first
    template = root / "llm" / "chat_template.jinja"
    template.write_text("{{ messages }} ")
    assert export_digest(read_export(root)) != first  # the template counts too


def test_a_large_file_is_hashed_once_and_its_memo_cannot_vouch_for_other_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgekit.converters.tensorrt.folder as folder_mod

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    root = _write_export(tmp_path / "v")
    data = root / "llm" / "model.onnx.data"
    data.write_bytes(b"\x00" * folder_mod.MEMO_MIN)
    hashed: list[int] = []
    real = folder_mod._hash_file

    def counting(f: Any) -> str:
        hashed.append(os.fstat(f.fileno()).st_size)
        return real(f)

    monkeypatch.setattr(folder_mod, "_hash_file", counting)
    # a file changed moments ago may change again within its timestamps' tick: its
    # hash is not remembered
    first = folder_mod.file_sha256(root, "llm/model.onnx.data")
    assert folder_mod.file_sha256(root, "llm/model.onnx.data") == first
    assert hashed.count(folder_mod.MEMO_MIN) == 2
    assert not (tmp_path / "cache" / "digests").exists()
    monkeypatch.setattr(folder_mod, "RACY_NS", 0)
    hashed.clear()
    folder_mod.file_sha256(root, "llm/model.onnx.data")
    assert folder_mod.file_sha256(root, "llm/model.onnx.data") == first
    assert hashed == [folder_mod.MEMO_MIN]  # hashed once, then remembered
    memos = list((tmp_path / "cache" / "digests").iterdir())
    assert len(memos) == 1 and not list(root.rglob("*digest*"))  # the memo is not the variant's
    # rewritten in place (same inode, size and mtime): its ctime moved, the memo is not used
    st = data.stat()
    data.write_bytes(b"\x01" * folder_mod.MEMO_MIN)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    want = (folder_mod.MEMO_MIN, hashlib.sha256(b"\x01" * folder_mod.MEMO_MIN).hexdigest())
    assert folder_mod.file_sha256(root, "llm/model.onnx.data") == want
    # a memo that is not one (a torn write, a digest that is not hex, another key) is
    # ignored: the file is hashed again
    for record in ({"sha256": "not a digest"}, {"key": ["elsewhere"]}):
        for memo in (tmp_path / "cache" / "digests").iterdir():
            memo.write_text(json.dumps({**json.loads(memo.read_text()), **record}))
        hashed.clear()
        assert folder_mod.file_sha256(root, "llm/model.onnx.data") == want
        assert hashed == [folder_mod.MEMO_MIN]


# --- the exporter's subprocess, with a stand-in exporter ---------------------------------


def _fake_exporter(tools: Path, body: str) -> None:
    """A tool environment whose tensorrt-edgellm-export is the shell script ``body``
    (called as ``SCRIPT SRC OUT``), stamped for the real requirements."""
    import hashlib
    import sys

    root = tools / EXPORT_ENV.name
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    script = root / "bin" / "tensorrt-edgellm-export"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    digest = hashlib.sha256(EXPORT_ENV.requirements.read_bytes()).hexdigest()
    (root / "edgekit-tool-env.json").write_text(json.dumps({"requirements_sha256": digest}))


def test_the_export_drives_the_exporter_and_checks_what_it_wrote(
    tmp_path: Path, no_tools: Path
) -> None:
    prepared = _write_export(tmp_path / "prepared")
    _fake_exporter(
        no_tools,
        f'echo "[LLM] Loading checkpoint from $1"\nmkdir -p "$2"\ncp -r {prepared}/llm "$2/"\n',
    )
    src = _fake_hf(tmp_path / "src", "qwen3")  # bf16: no staging
    events: list[str] = []
    convert.convert_model(
        src, "tensorrt", tmp_path / "out", recipe="soc=GH100",
        progress=lambda e: events.append(e.detail),
    )  # fmt: skip
    folder = read_export(tmp_path / "out")
    assert folder.settings.soc == "GH100" and folder.settings.max_kv_cache_capacity == 2048
    assert events[:2] == ["staging the checked files", "loading the checkpoint"]
    assert events[-1] == "written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tools", "out", "prepared", "src"]


def test_an_export_that_disagrees_with_the_source_is_not_kept(
    tmp_path: Path, no_tools: Path
) -> None:
    prepared = _write_export(tmp_path / "prepared")  # head_dim 32; the Llama's is 16
    _fake_exporter(no_tools, f'mkdir -p "$2"\ncp -r {prepared}/llm "$2/"\n')
    src = _fake_hf(tmp_path / "src", "llama", vocab_size=256)
    with pytest.raises(ConversionError, match=r"head_dim 32 \(source 16\)"):
        convert.convert_model(src, "tensorrt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_exporter_failure_is_one_line_without_the_traceback(
    tmp_path: Path, no_tools: Path
) -> None:
    _fake_exporter(
        no_tools,
        'mkdir -p "$2/llm"\necho "Traceback (most recent call last):"\n'
        'echo "## Exception summary"\necho\n'
        "echo \"<class 'TypeError'>: FP16Linear expects float16 input\" >&2\nexit 1\n",
    )
    src = _fake_hf(tmp_path / "src", "qwen3")
    with pytest.raises(ConversionError) as e:
        convert.convert_model(src, "tensorrt", tmp_path / "out")
    assert e.value.message == (
        "the Edge-LLM exporter failed on src: <class 'TypeError'>: FP16Linear expects float16 input"
    )
    assert "Traceback" not in str(e.value) and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tools", "src"]


def test_what_else_the_exporter_writes_is_not_published(tmp_path: Path, no_tools: Path) -> None:
    prepared = _write_export(tmp_path / "prepared")
    _fake_exporter(
        no_tools,
        f'mkdir -p "$2"\ncp -r {prepared}/llm "$2/"\nln -s /etc "$2/etc"\necho x > "$2/run.sh"\n',
    )
    src = _fake_hf(tmp_path / "src", "qwen3")
    with pytest.raises(ConversionError, match="etc: is a symbolic link|run.sh: is a regular"):
        convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=GH100")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tools", "prepared", "src"]


def test_an_exporter_that_exits_0_without_its_files_is_a_failure(
    tmp_path: Path, no_tools: Path
) -> None:
    prepared = _write_export(tmp_path / "prepared")
    _fake_exporter(
        no_tools, f'mkdir -p "$2"\ncp -r {prepared}/llm "$2/"\nrm "$2/llm/model.onnx.data"\n'
    )
    src = _fake_hf(tmp_path / "src", "qwen3")
    with pytest.raises(ConversionError, match="missing model.onnx.data"):
        convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=GH100")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tools", "prepared", "src"]


def test_an_engine_json_planted_by_the_exporter_is_not_written_through(
    tmp_path: Path, no_tools: Path
) -> None:
    prepared = _write_export(tmp_path / "prepared")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    _fake_exporter(
        no_tools, f'mkdir -p "$2"\ncp -r {prepared}/llm "$2/"\nln -s {victim} "$2/engine.json"\n'
    )
    src = _fake_hf(tmp_path / "src", "qwen3")
    with pytest.raises(ConversionError, match="engine.json"):
        convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=GH100")
    assert victim.read_text() == "keep" and not (tmp_path / "out").exists()


def test_an_interrupted_export_stops_the_exporter_and_leaves_nothing(
    tmp_path: Path, no_tools: Path
) -> None:
    """Ctrl-C while the exporter runs (it can take minutes): the child is killed, not
    left running, and neither the output nor the private folder stays."""
    import time

    pid = tmp_path / "pid"
    _fake_exporter(
        no_tools, f'echo $$ > {pid}\nmkdir -p "$2/llm"\necho "Loading checkpoint"\nexec sleep 60\n'
    )
    src = _fake_hf(tmp_path / "src", "qwen3")

    def interrupt(event: Any) -> None:
        if event.detail == "loading the checkpoint":
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        convert.convert_model(src, "tensorrt", tmp_path / "out", progress=interrupt)
    assert time.monotonic() - started < 30
    child = int(pid.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # killed and reaped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tools", "pid", "src"]


def test_an_output_folder_the_exporter_made_a_link_is_not_published(
    tmp_path: Path, no_tools: Path
) -> None:
    prepared = _write_export(tmp_path / "prepared")
    _fake_exporter(no_tools, f'ln -s {prepared} "$2"\nrm {prepared}/engine.json\n')
    src = _fake_hf(tmp_path / "src", "qwen3")
    with pytest.raises(ConversionError, match="is a symbolic link, not a folder"):
        convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=GH100")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out").is_symlink()
    assert not (prepared / "engine.json").exists()  # nothing written through the link


def _remote_code_source(folder: Path) -> Path:
    """A Qwen3 folder whose config.json asks transformers to import its own Python file
    (``auto_map``), which would write a marker beside it when imported."""
    src = _fake_hf(folder, "qwen3")
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (src / "config.json").write_text(json.dumps(config))
    (src / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.Evil", None]}})
    )
    for name in ("configuration_evil.py", "tokenization_evil.py"):
        (src / name).write_text(
            "import pathlib\n"
            f"pathlib.Path({str(folder / 'RAN')!r}).write_text('remote code ran')\n"
            "from transformers import Qwen3Config as EvilConfig\n"
        )
    return src


def test_the_exporter_sees_only_a_staging_folder_offline(tmp_path: Path, no_tools: Path) -> None:
    """Edge-LLM's exporter reads configs with trust_remote_code=True and reaches for the
    Hub: it is given a staging folder of the checked files, without auto_map and without
    .py files, with the Hub switched off."""
    prepared = _write_export(tmp_path / "prepared")
    seen = tmp_path / "seen"
    _fake_exporter(
        no_tools,
        f'ls "$1" > {seen}.files\ncat "$1/config.json" "$1/tokenizer_config.json" > {seen}.json\n'
        f'echo "$HF_HUB_OFFLINE $TRANSFORMERS_OFFLINE" > {seen}.env\n'
        f'mkdir -p "$2"\ncp -r {prepared}/llm "$2/"\n',
    )
    src = _remote_code_source(tmp_path / "src")
    convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=GH100")
    files = Path(f"{seen}.files").read_text().split()
    assert "config.json" in files and not [f for f in files if f.endswith(".py")]
    assert "auto_map" not in Path(f"{seen}.json").read_text()
    assert Path(f"{seen}.env").read_text().split() == ["1", "1"]
    assert not (tmp_path / "src" / "RAN").exists()


# --- the export itself (needs the tool environment) -----------------------------------------


def _require_export_env() -> None:
    found = status(EXPORT_ENV)
    if not found.ready:
        message = (
            f"the Edge-LLM export needs tool environment {found.name} at {found.path}: "
            f"{found.reason} (create it with: {EXPORT_ENV.install_hint})"
        )
        if STRICT:  # .ci/setup installs it
            pytest.fail(message + " (EDGEKIT_STRICT=1: set-up should have installed it)")
        pytest.skip(message)


@dataclass
class Exports:
    root: Path
    done: dict[str, tuple[Path, Path]] = field(default_factory=dict)

    def get(self, family: str) -> tuple[Path, Path]:
        """(source, export) of a tiny random ``family`` model, exported once."""
        from tests.tiny_models import build_tiny_model

        if family not in self.done:
            src = build_tiny_model(family, self.root / f"{family}-hf")
            out = self.root / f"{family}-trt"
            convert.convert_model(src, "tensorrt", out, recipe="soc=ORIN")
            self.done[family] = (src, out)
        return self.done[family]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exports]:
    _require_export_env()
    for module in ("torch", "transformers", "onnx", "safetensors", "numpy"):
        require(module, "the tiny models and the checks of the export need it")
    yield Exports(root=tmp_path_factory.mktemp("trt-exports"))


def _source_tensors(src: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return load_file(str(src / "model.safetensors"))


def _initializers(llm: Path) -> list[Any]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(llm / "model.onnx"), load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(llm))
    return [numpy_helper.to_array(t) for t in model.graph.initializer]


def _appears_in(matrix: Any, initializers: list[Any]) -> bool:
    """``matrix`` [out, in] is a block of rows of an initializer [*, in], or (the
    exporter's FP16Linear stores weights transposed, q/k/v fused) a block of columns of
    one [in, *]."""
    import numpy as np

    rows, cols = matrix.shape
    for init in initializers:
        if init.ndim != 2 or init.dtype != np.float16:
            continue
        for view in (init, init.T):
            if view.shape[1] != cols:
                continue
            if any(
                np.array_equal(view[r : r + rows], matrix)
                for r in range(0, view.shape[0] - rows + 1)
            ):
                return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("family", EXPORT_FAMILIES)
def test_a_tiny_model_exports_with_its_weights_intact(exports: Exports, family: str) -> None:
    import numpy as np
    from safetensors.numpy import load_file

    src, out = exports.get(family)
    folder = read_export(out)
    source_config = json.loads((src / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        assert folder.config[key] == source_config[key], key
    assert folder.config["num_key_value_heads"] == source_config["num_key_value_heads"]
    assert json.loads((out / ENGINE_JSON).read_text()) == {
        "schema": 1,
        "precision": "F16",
        "max_batch_size": 1,
        "max_input_len": 512,  # min(2048, context 1024 - 512)
        "max_output_len": 512,
        "max_kv_cache_capacity": 1024,
        "kv_cache_type": "fp16",
        "soc": "ORIN",
        "edgellm_version": EDGELLM_VERSION,
    }
    tensors = _source_tensors(src)
    embedding = load_file(str(out / "llm" / "embedding.safetensors"))["embedding"]
    want = tensors["model.embed_tokens.weight"].astype(np.float16)
    assert embedding.dtype == np.float16 and embedding.tobytes() == want.tobytes()
    inits = _initializers(out / "llm")
    matrices = {
        k: v for k, v in tensors.items() if v.ndim == 2 and k != "model.embed_tokens.weight"
    }
    assert len(matrices) >= 7 * source_config["num_hidden_layers"]
    missing = [k for k, v in matrices.items() if not _appears_in(v.astype(np.float16), inits)]
    assert not missing, f"not found among the ONNX initializers: {missing}"
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / "llm" / name).read_bytes() == (src / name).read_bytes()


@pytest.mark.slow
def test_a_changed_weight_is_seen(exports: Exports) -> None:
    """The check above can fail: a matrix that is not in the export is not found."""
    import numpy as np

    src, out = exports.get("llama")
    inits = _initializers(out / "llm")
    w = _source_tensors(src)["model.layers.0.mlp.down_proj.weight"].astype(np.float16)
    assert _appears_in(w, inits)
    w[3, 5] = w[3, 5] + np.float16(0.5)
    assert not _appears_in(w, inits)


@pytest.mark.slow
def test_the_output_exists_refusal_and_force(exports: Exports, tmp_path: Path) -> None:
    from edgekit.errors import OutputExistsError

    src, out = exports.get("qwen3")
    with pytest.raises(OutputExistsError):
        convert.convert_model(src, "tensorrt", out)
    before = os.stat(out).st_ino
    convert.convert_model(src, "tensorrt", out, force=True, recipe="soc=ORIN")
    assert os.stat(out).st_ino != before  # a new folder, renamed into place
    assert read_export(out).settings.soc == "ORIN"
    assert not [p for p in out.parent.iterdir() if ".partial" in p.name or ".build" in p.name]


@pytest.mark.slow
def test_the_real_exporter_runs_no_code_shipped_with_the_model(
    exports: Exports, tmp_path: Path
) -> None:
    """The same with NVIDIA's exporter: it would import configuration_evil.py (it passes
    trust_remote_code=True) had it been given the user's folder."""
    from tests.tiny_models import build_tiny_model

    src = build_tiny_model("qwen3", tmp_path / "src")
    evil = _remote_code_source(tmp_path / "evil")
    (src / "configuration_evil.py").write_bytes((evil / "configuration_evil.py").read_bytes())
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (src / "config.json").write_text(json.dumps(config))
    convert.convert_model(src, "tensorrt", tmp_path / "out", recipe="soc=ORIN")
    assert read_export(tmp_path / "out").config["num_hidden_layers"] == 2
    assert not (tmp_path / "evil" / "RAN").exists()
