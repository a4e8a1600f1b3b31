"""The OpenVINO converter and target: parity with transformers, the default model in
INT4 and INT8, precision choice, devices, and refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.errors import (
    GenerationError,
    ModelFormatError,
    OutputExistsError,
    TargetUnavailableError,
    UnsupportedArchitectureError,
    UnsupportedConversionError,
)
from tests.conftest import require

PROMPT = "It is a truth universally acknowledged, that a single man"
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require("optimum", "OpenVINO export uses optimum-intel")
    require("openvino_genai", "the target runs openvino-genai")
    from tests.tiny_models import build_tiny_model

    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build_tiny_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get


@pytest.fixture(scope="module")
def f16(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny family's F16 export, made once per module: the tests that only load one share
    it (each export is seconds of optimum-intel). The two F16 tests check it as written."""
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            out = tmp_path_factory.mktemp(f"{family}-f16") / "ov"
            cache[family] = _export(tiny(family), out, "F16")
        return cache[family]

    return get


def _export(src: Path, out: Path, quant: str, recipe: str | None = None) -> Path:
    from edgekit.converters.convert import convert_model

    convert_model(src, "openvino", out, quant=quant, recipe=recipe)
    return out


def _reference(
    src: Path, text: str, new_tokens: int, *, f16_weights: bool = False
) -> tuple[list[int], list[int], np.ndarray]:
    """Prompt ids, transformers' greedy continuation (ids) and the prompt's logits, in
    float32; ``f16_weights``: with every weight rounded to f16 first (what an F16 export
    stores), so the comparison checks the conversion, not the rounding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    if f16_weights:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                if t.is_floating_point():
                    t.copy_(t.to(torch.float16).to(torch.float32))
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
        )[0, ids.shape[1] :]
    return ids[0].tolist(), out.tolist(), logits


@pytest.mark.parametrize("family", FAMILIES)
def test_f16_export_matches_transformers(tiny: Any, f16: Any, family: str) -> None:
    """f32 inference on the f16 weights against transformers on the same f16-rounded
    weights: tokenization identical, logits within 1e-4 of the largest logit (seen:
    ~1e-6), and the same 16 greedy tokens: along transformers' greedy path every OpenVINO
    argmax is transformers' next token, and the pipeline's own greedy text is the
    decoding of those tokens."""
    from edgekit.targets.openvino import OpenVinoTarget

    src = tiny(family)
    folder = f16(family)
    ids, ref_tokens, ref_logits = _reference(src, PROMPT, 16, f16_weights=True)
    with OpenVinoTarget.load(folder, inference_precision="f32") as s:
        assert s.tokenize(PROMPT) == ids
        got = s.logits(ids)
        path = s.logits(ids + ref_tokens)
        g = s.generate(PROMPT, max_tokens=16, temperature=0)
        expected_text = s.detokenize(ref_tokens[: g.completion_tokens])
    assert np.abs(got - ref_logits).max() <= 1e-4 * np.abs(ref_logits).max()
    assert path[len(ids) - 1 : -1].argmax(-1).tolist() == ref_tokens
    assert g.completion_tokens == 16 or g.finish_reason == "stop"
    assert g.text == expected_text


def test_f16_export_stores_f16_weights(tiny: Any, f16: Any) -> None:
    """F16 is f16 on disk: every weight constant of the IR is f16 (as optimum-cli's
    --weight-format fp16 writes it), and openvino_model.bin is 2 bytes per parameter."""
    import openvino as ov

    from edgekit.inspection import inspect_model

    src = tiny("llama")  # float32 safetensors
    folder = f16("llama")
    model = ov.Core().read_model(folder / "openvino_model.xml")
    by_type: dict[str, int] = {}
    for op in model.get_ops():
        if op.get_type_name() == "Constant":
            kind = op.get_output_element_type(0).get_type_name()
            by_type[kind] = by_type.get(kind, 0) + op.get_byte_size()
    floats = {k: v for k, v in by_type.items() if k in ("f16", "bf16", "f32", "f64")}
    assert max(floats, key=lambda k: floats[k]) == "f16"
    assert floats.get("f32", 0) < 0.001 * floats["f16"], floats  # a few scalars, no weights
    parameters = inspect_model(src).parameters
    size = (folder / "openvino_model.bin").stat().st_size
    assert size == pytest.approx(2 * parameters, rel=0.01), (size, parameters)
    settings = json.loads((folder / "edgekit.json").read_text())
    assert settings["quant"] == "F16"


@pytest.mark.parametrize("quant", ["INT8", "INT4", "INT4_SYM"])
def test_compressed_exports_load_generate_and_stay_close(
    tiny: Any, tmp_path: Path, quant: str
) -> None:
    from edgekit.targets.openvino import OpenVinoTarget

    src = tiny("qwen2")
    folder = _export(src, tmp_path / "ov", quant)
    ids, _, ref = _reference(src, PROMPT, 1)
    with OpenVinoTarget.load(folder) as s:
        got = s.logits(ids)
        assert s.generate(PROMPT, max_tokens=8, temperature=0).completion_tokens > 0
    # Top-1 agreement with transformers over the prompt. Random tiny weights quantize badly
    # (per-channel symmetric 4-bit worst of all, seen 0.24 here); chance is 1/512, and an
    # export that scrambled the weights sits there.
    agreement = float((got.argmax(-1) == ref.argmax(-1)).mean())
    assert agreement >= {"INT8": 0.85, "INT4": 0.4, "INT4_SYM": 0.15}[quant]
    settings = json.loads((folder / "edgekit.json").read_text())
    assert settings["quant"] == quant and settings["inference_precision"] in ("f32", "bf16")


def test_int4_group_size_and_ratio_reach_nncf(tiny: Any, tmp_path: Path) -> None:
    import openvino as ov

    folder = _export(
        tiny("llama"), tmp_path / "ov", "INT4", recipe="group_size=64,ratio=0.5,embeddings=F16"
    )
    model = ov.Core().read_model(folder / "openvino_model.xml")
    types = {
        op.get_output_element_type(0).get_type_name()
        for op in model.get_ops()
        if op.get_type_name() == "Constant"
    }
    assert "u4" in types and "u8" in types  # half the layers INT4, the rest (and embeddings) INT8
    warnings = json.loads((folder / "edgekit.json").read_text())["warnings"]
    assert any("embeddings=F16" in w for w in warnings)  # reported, not dropped


def test_data_aware_compression_uses_a_local_text(tiny: Any, tmp_path: Path) -> None:
    from importlib import resources

    text = tmp_path / "calibration.txt"
    text.write_text(
        resources.files("edgekit.data")
        .joinpath("pride-and-prejudice-opening.txt")
        .read_text()[:8000]
    )
    folder = _export(tiny("qwen3"), tmp_path / "ov", "INT4", recipe=f"calibration={text}")
    recipe = json.loads(json.loads((folder / "edgekit.json").read_text())["recipe"])
    assert recipe["calibration"] == str(text)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["INT8", "INT4"])
def test_default_model(request: pytest.FixtureRequest, quant: str) -> None:
    """The embedded model in INT8 (f32): the same 16 greedy tokens as transformers on the same
    weights; INT4 loads and writes coherent text.

    The exports are the session's (tests/conftest.py), built by the same converter from the
    same dequantized folder: INT8 by convert_model, INT4 by pack (the benchmarks' bundle),
    each minutes of export that this test would otherwise repeat."""
    from edgekit.targets.openvino import OpenVinoTarget

    base = request.getfixturevalue("smollm2_dequantized").path
    if quant == "INT8":
        folder = request.getfixturevalue("smollm2_openvino_int8")
    else:
        folder = request.getfixturevalue("smollm2_bundle") / "openvino-int4"
    prompt = "The capital of France is"
    with OpenVinoTarget.load(folder, inference_precision="f32") as s:
        g = s.generate(prompt, max_tokens=16, temperature=0)
        chat = s.chat([{"role": "user", "content": "Name a colour."}], max_tokens=12, temperature=0)
    assert "Paris" in g.text and chat.completion_tokens > 0
    if quant == "INT8":
        from transformers import AutoTokenizer

        _, ref_tokens, _ = _reference(base, prompt, 16)
        assert g.text == AutoTokenizer.from_pretrained(base).decode(
            ref_tokens, skip_special_tokens=True
        )


def test_generation_controls(f16: Any) -> None:
    import threading

    from edgekit.targets.openvino import OpenVinoTarget

    folder = f16("qwen2")
    with OpenVinoTarget.load(folder) as s:
        full = s.generate(PROMPT, max_tokens=20, temperature=0)
        chunks = list(s.stream(PROMPT, max_tokens=20, temperature=0))
        assert "".join(c.text for c in chunks) == full.text
        assert sum(c.tokens for c in chunks) == full.completion_tokens
        stop = full.text[5:8]
        stopped = s.generate(PROMPT, max_tokens=20, temperature=0, stop=[stop])
        assert (
            stopped.finish_reason == "stop" and stopped.text == full.text[: full.text.index(stop)]
        )
        a = s.generate(PROMPT, max_tokens=12, temperature=1.0, seed=3).text
        assert a == s.generate(PROMPT, max_tokens=12, temperature=1.0, seed=3).text
        seen = []
        for chunk in s.stream(PROMPT, max_tokens=200, temperature=0):
            seen.append(chunk)
            if len(seen) == 2:
                threading.Thread(target=s.cancel).start()
        assert seen[-1].finish_reason == "cancelled" and len(seen) < 100
        assert "<|im_start|>" in s.render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(GenerationError, match="closed"):
        s.generate(PROMPT, max_tokens=2)


def test_devices() -> None:
    from edgekit.targets.openvino import available_devices, pick_device

    present = available_devices()
    assert "CPU" in present
    assert pick_device("auto", ["CPU", "GPU.0", "NPU"]) == "NPU"
    assert pick_device("auto", ["CPU", "GPU.0"]) == "GPU.0"
    assert pick_device("auto", present) in present
    if "NPU" not in present:
        with pytest.raises(TargetUnavailableError) as info:
            pick_device("NPU", present)
        assert "OpenVINO sees: " + ", ".join(present) in info.value.message


def test_the_npu_path_compiles_for_npu_and_enforces_its_prompt_limit(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NPU path, simulated on the CPU (no NPU here): OpenVINO lists an NPU, so auto
    picks it; the pipeline is asked for with the NPU's device name and its static shapes
    (MAX_PROMPT_LEN, MIN_RESPONSE_LEN) and built on the CPU; a prompt longer than the
    compiled limit is refused before it runs, a shorter one runs."""
    import edgekit.targets.openvino as target
    import openvino_genai

    folder = _export(tiny("qwen2"), tmp_path / "ov", "INT4_SYM")
    asked: list[tuple[str, dict[str, Any]]] = []
    real = openvino_genai.LLMPipeline

    def pipeline(path: str, device: str, **properties: Any) -> Any:
        asked.append((device, properties))
        on_cpu = {k: v for k, v in properties.items() if not k.endswith(("PROMPT_LEN", "RESPONSE_LEN"))}
        return real(path, "CPU", **on_cpu)

    monkeypatch.setattr(target, "available_devices", lambda: ["CPU", "GPU.0", "NPU"])
    monkeypatch.setattr(openvino_genai, "LLMPipeline", pipeline)
    with target.OpenVinoTarget.load(folder, max_prompt_len=8, min_response_len=16) as s:
        assert asked == [
            (
                "NPU",
                {
                    "INFERENCE_PRECISION_HINT": "f16",
                    "KV_CACHE_PRECISION": "f16",
                    "MAX_PROMPT_LEN": 8,
                    "MIN_RESPONSE_LEN": 16,
                },
            )
        ]
        assert s.info.settings == {
            "device": "NPU",
            "inference_precision": "f16",
            "max_prompt_len": 8,
            "min_response_len": 16,
        }
        with pytest.raises(GenerationError, match="compiled for at most 8") as info:
            s.generate("word " * 40, max_tokens=4)
        assert "max_prompt_len" in info.value.hint
        assert s.generate("Hi", max_tokens=2, temperature=0).completion_tokens >= 1


def test_refusals(tiny: Any, f16: Any, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model
    from edgekit.targets.openvino import OpenVinoTarget

    src = tmp_path / "src"
    shutil.copytree(tiny("llama"), src)
    (src / "tokenizer.json").unlink()
    with pytest.raises(UnsupportedConversionError, match="no tokenizer"):
        convert_model(src, "openvino", tmp_path / "a", quant="INT4")
    with pytest.raises(UnsupportedConversionError, match="Gemma 3"):
        convert_model(tiny("gemma3"), "openvino", tmp_path / "b", quant="INT4")
    bert = tmp_path / "bert"
    shutil.copytree(tiny("llama"), bert)
    config = json.loads((bert / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertModel"])
    (bert / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="not supported"):
        convert_model(bert, "openvino", tmp_path / "c", quant="INT4")
    with pytest.raises(UnsupportedConversionError, match="INT3"):
        convert_model(tiny("llama"), "openvino", tmp_path / "d", quant="INT3")
    (tmp_path / "e").mkdir()
    with pytest.raises(OutputExistsError):
        convert_model(tiny("llama"), "openvino", tmp_path / "e", quant="INT4")
    with pytest.raises(ModelFormatError, match="not an OpenVINO export"):
        OpenVinoTarget.load(tiny("llama"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "e", "src"]
    from edgekit.targets.openvino import available_devices

    if "NPU" not in available_devices():  # this machine has none: asking for one is refused
        with pytest.raises(TargetUnavailableError, match="OpenVINO sees"):
            OpenVinoTarget.load(f16("qwen2"), device="NPU")
