"""The GGUF converter's behaviour: round trips of the default model, recipes, requantizing,
and every kind of bad input leaving nothing behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from edgekit.errors import (
    ConversionError,
    ModelFormatError,
    OutputExistsError,
    UnsupportedArchitectureError,
    UnsupportedConversionError,
)
from edgekit.gguf_header import read_gguf_header
from tests.conftest import require

if TYPE_CHECKING:
    from edgekit.converters.convert import ConvertResult

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("transformers", "tiny models are built with transformers")
    from tests.tiny_models import build_tiny_model

    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"), hidden=256)


@pytest.fixture(scope="module")
def default_roundtrip(smollm2_dequantized: ConvertResult) -> Path:
    """The default model dequantized to a Hugging Face folder by edgekit (the session's
    conversion, tests/conftest.py: test_accuracy and test_openvino_target start from it)."""
    assert any("quantization error" in w for w in smollm2_dequantized.warnings)
    return smollm2_dequantized.path


def _no_leftovers(folder: Path, name: str) -> None:
    assert not (folder / name).exists()
    assert not [p for p in folder.iterdir() if ".partial-" in p.name or "intermediate" in p.name]


# --- the default model ----------------------------------------------------------------


@pytest.mark.slow
def test_default_model_roundtrip_tokenizes_identically(
    default_roundtrip: Path, default_gguf: Path
) -> None:
    require("transformers", "the exported tokenizer is loaded with transformers")
    from edgekit.targets.llamacpp import LlamaCppTarget
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_roundtrip)
    texts = [
        PROMPT,
        "It's 2026: 12345 apples, ünïcödé, 日本語.\n\n\tTabs.",
        "<|im_start|>user\nHi<|im_end|>\n",
    ]
    with LlamaCppTarget.load(default_gguf) as session:
        for text in texts:
            assert tok(text)["input_ids"] == session.tokenize(text), text
    provenance = json.loads((default_roundtrip / "edgekit.json").read_text())
    assert provenance["source_file_type"] == "Q4_1" and provenance["warnings"]


@pytest.mark.slow
def test_default_model_roundtrip_is_lossless(
    default_roundtrip: Path, smollm2_f32_gguf: Path, default_gguf: Path, tmp_path: Path
) -> None:
    """GGUF Q4_1 -> HF -> GGUF F32 -> Q4_1 reproduces every tensor of the original bit
    for bit: the dequantize/convert path adds no error of its own."""
    from edgekit.converters.convert import convert_model
    from edgekit.targets.llamacpp import LlamaCppTarget

    f32 = smollm2_f32_gguf  # default_roundtrip as F32 by edgekit's writer (tests/conftest.py)
    q41 = tmp_path / "q41.gguf"
    convert_model(f32, "gguf", q41, quant="Q4_1")
    a, b = read_gguf_header(default_gguf), read_gguf_header(q41)
    assert sorted(t.name for t in a.tensors) == sorted(t.name for t in b.tensors)
    others = {t.name: t for t in b.tensors}
    for ta in a.tensors:
        tb = others[ta.name]
        assert ta.dtype == tb.dtype, ta.name
        x = np.memmap(a.path, np.uint8, "r", a.tensor_offsets[ta.name], (ta.nbytes,))
        y = np.memmap(b.path, np.uint8, "r", b.tensor_offsets[tb.name], (tb.nbytes,))
        assert np.array_equal(x, y), ta.name
    with LlamaCppTarget.load(default_gguf) as original, LlamaCppTarget.load(q41) as again:
        first = original.generate(PROMPT, max_tokens=32, temperature=0)
        assert again.generate(PROMPT, max_tokens=32, temperature=0).text == first.text
        assert first.completion_tokens == 32


@pytest.mark.slow
def test_default_model_f16_roundtrip_generates_like_the_reference(
    default_roundtrip: Path, tmp_path: Path
) -> None:
    """The F16 round trip, greedy, for 32 tokens equals transformers on the same weights.

    (Against the original Q4_1 file, greedy output is not expected to be identical: llama.cpp
    multiplies Q4_1 weights with activations quantized to Q8_1, an F16 file does not. The
    bit-exact test above covers the original.)"""
    require("torch", "the reference runs in transformers")
    import torch
    from edgekit.converters.convert import convert_model
    from edgekit.targets.llamacpp import LlamaCppTarget
    from transformers import AutoModelForCausalLM, AutoTokenizer

    f16 = tmp_path / "f16.gguf"
    convert_model(default_roundtrip, "gguf", f16, quant="F16")
    with LlamaCppTarget.load(f16) as session:
        ours = session.generate(PROMPT, max_tokens=32, temperature=0)
        ids = session.tokenize(PROMPT)
        generated = session.tokenize(ours.text, add_special=False)
    tok = AutoTokenizer.from_pretrained(default_roundtrip)
    model = AutoModelForCausalLM.from_pretrained(default_roundtrip, dtype=torch.float32)
    with torch.no_grad():
        prompt = torch.tensor([ids])
        ref = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False
        )[0, len(ids) :]
    reference_text = tok.decode(ref, skip_special_tokens=True)
    # Up to 32 tokens: both stop at the end-of-sequence token if the model emits one.
    assert ours.text == reference_text
    assert ours.completion_tokens == len([t for t in ref.tolist() if t != tok.eos_token_id])
    assert len(set(generated)) > 8, "coherent text, not a repeated token"
    assert "Paris" in ours.text


# --- recipes and requantizing -----------------------------------------------------------


def test_recipe_controls_reach_the_file(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model
    from edgekit.targets.llamacpp import LlamaCppTarget

    out = tmp_path / "m.gguf"
    convert_model(
        tiny_llama, "gguf", out, quant="Q4_K_M", recipe="embeddings=Q8_0,output=Q6_K,kv_cache=q8_0"
    )
    header = read_gguf_header(out)
    types = {t.name: t.dtype for t in header.tensors}
    assert types["token_embd.weight"] == "Q8_0"
    assert types["output.weight"] == "Q6_K"
    assert json.loads(header.get("edgekit.recipe"))["kv_cache"] == "q8_0"
    with LlamaCppTarget.load(out) as session:
        assert session.info.kv_cache == "q8_0"
        assert session.generate(PROMPT, max_tokens=4, temperature=0).completion_tokens > 0


def test_requantizing_warns_about_stacked_error(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    q8 = tmp_path / "q8.gguf"
    assert convert_model(tiny_llama, "gguf", q8, quant="Q8_0").warnings == ()
    result = convert_model(q8, "gguf", tmp_path / "q4.gguf", quant="Q4_K_M")
    assert any("both quantization errors" in w for w in result.warnings)


def test_requantized_file_records_its_own_recipe(tiny_llama: Path, tmp_path: Path) -> None:
    """llama.cpp copies the source's metadata: an F16 file's recipe must not survive into
    the Q4_K_M made from it."""
    from edgekit.converters.convert import convert_model

    f16 = tmp_path / "f16.gguf"
    convert_model(tiny_llama, "gguf", f16, quant="F16", recipe="kv_cache=q8_0")
    assert json.loads(read_gguf_header(f16).get("edgekit.recipe"))["weights"] == "F16"
    q4 = tmp_path / "q4.gguf"
    convert_model(f16, "gguf", q4, quant="Q4_K_M", recipe="output=Q6_K")
    header = read_gguf_header(q4)
    recipe = json.loads(header.get("edgekit.recipe"))
    assert recipe == {"weights": "Q4_K_M", "output": "Q6_K", "kv_cache": "f16"}
    assert header.get("general.file_type") == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    # and requantizing again records the new format
    plain = tmp_path / "plain.gguf"
    convert_model(q4, "gguf", plain, quant="Q8_0")
    assert json.loads(read_gguf_header(plain).get("edgekit.recipe"))["weights"] == "Q8_0"


@pytest.mark.parametrize(
    "quant", ["Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_S", "Q4_0", "IQ4_NL", "Q3_K_M", "Q2_K", "BF16"]
)
def test_every_offered_format_writes_a_loadable_file(
    tiny_llama: Path, tmp_path: Path, quant: str
) -> None:
    from edgekit.converters.convert import convert_model
    from edgekit.converters.gguf.table import GGUF_FORMATS
    from edgekit.targets.llamacpp import LlamaCppTarget

    out = tmp_path / f"{quant}.gguf"
    convert_model(tiny_llama, "gguf", out, quant=quant)
    assert read_gguf_header(out).get("general.file_type") == GGUF_FORMATS[quant].ftype
    with LlamaCppTarget.load(out) as session:
        assert session.generate(PROMPT, max_tokens=3, temperature=0).completion_tokens > 0


# --- bad input ----------------------------------------------------------------------------


def test_output_exists_without_force(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    out = tmp_path / "m.gguf"
    out.write_text("precious")
    with pytest.raises(OutputExistsError):
        convert_model(tiny_llama, "gguf", out, quant="F16")
    assert out.read_text() == "precious"
    convert_model(tiny_llama, "gguf", out, quant="F16", force=True)
    assert read_gguf_header(out).tensors


def test_truncated_source_fails_before_writing(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelFormatError, match="truncated"):
        convert_model(src, "gguf", tmp_path / "out.gguf", quant="Q8_0")
    _no_leftovers(tmp_path, "out.gguf")


def test_corrupt_gguf_source(tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 30)
    with pytest.raises(ModelFormatError):
        convert_model(bad, "gguf", tmp_path / "out.gguf", quant="Q4_K_M")
    _no_leftovers(tmp_path, "out.gguf")


def test_unsupported_architecture(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError):
        convert_model(src, "gguf", tmp_path / "out.gguf", quant="F16")
    _no_leftovers(tmp_path, "out.gguf")


def test_unknown_tensor_is_refused_before_writing(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    from tests.builders import safetensors_bytes

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    (src / "adapter.safetensors").write_bytes(safetensors_bytes({"lora_A.weight": ((4, 4), "F32")}))
    with pytest.raises(UnsupportedConversionError, match="lora_A"):
        convert_model(src, "gguf", tmp_path / "out.gguf", quant="F16")
    _no_leftovers(tmp_path, "out.gguf")


def test_unknown_pre_tokenizer_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Isolated", "invert": False},
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": False,
            },
        ],
    }
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(UnsupportedConversionError, match="pre-tokenizer"):
        convert_model(src, "gguf", tmp_path / "out.gguf", quant="F16")
    _no_leftovers(tmp_path, "out.gguf")
    convert_model(src, "gguf", tmp_path / "out.gguf", quant="F16", tokenizer_pre="gpt-2")


@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_disk_full_leaves_no_partial_file(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quant: str
) -> None:
    import gguf
    from edgekit.converters.convert import convert_model

    written = []

    def failing(self, tensor, *a, **k):  # type: ignore[no-untyped-def]
        if written:
            raise OSError(28, "No space left on device")
        written.append(tensor)
        return original(self, tensor, *a, **k)

    original = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing)
    with pytest.raises(ConversionError, match="No space left"):
        convert_model(tiny_llama, "gguf", tmp_path / "out.gguf", quant=quant)
    _no_leftovers(tmp_path, "out.gguf")


def test_bad_quant_and_recipe_names(tiny_llama: Path, tmp_path: Path) -> None:
    from edgekit.converters.convert import convert_model

    with pytest.raises(UnsupportedConversionError, match="Q9_X"):
        convert_model(tiny_llama, "gguf", tmp_path / "a.gguf", quant="Q9_X")
    with pytest.raises(UnsupportedConversionError, match="colour"):
        convert_model(tiny_llama, "gguf", tmp_path / "a.gguf", quant="Q8_0", recipe="colour=red")
    with pytest.raises(UnsupportedConversionError, match="KV-cache"):
        convert_model(tiny_llama, "gguf", tmp_path / "a.gguf", quant="Q8_0", recipe="kv_cache=q3")
    _no_leftovers(tmp_path, "a.gguf")


def test_cli_convert(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    cmd = [
        sys.executable,
        "-m",
        "edgekit",
        "convert",
        str(tiny_llama),
        "--to",
        "gguf",
        "--quant",
        "Q8_0",
        "-o",
        str(out),
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["quant"] == "Q8_0"
    again = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=300)
    assert again.returncode == 1
    assert "already exists" in again.stderr and "--force" in again.stderr
    assert "Traceback" not in again.stderr
