"""Per-tensor format layouts, checked against files the real converters wrote."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from edgekit.converters.formats import Format
from edgekit.converters.gguf.layout import gguf_layout
from edgekit.converters.layouts import (
    IntScheme,
    int_nbytes,
    tensor_role,
)
from edgekit.converters.openvino.layout import openvino_layout

from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.modelspec import TensorInfo
from tests.conftest import require

FORMATS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S", "Q4_0", "IQ4_NL", "Q3_K_M", "Q2_K")


def _actual_types(path: Path) -> dict[str, tuple[str, int]]:
    return {t.name: (t.dtype, t.nbytes) for t in inspect_model(path).tensors}


def _check(spec_path: Path, quantized: Path, fmt: str) -> None:
    predicted = gguf_layout(inspect_model(spec_path), fmt)
    actual = _actual_types(quantized)
    got = {t.name: (t.storage, t.nbytes) for t in predicted.tensors}
    assert got == actual, {k: (got.get(k), v) for k, v in actual.items() if got.get(k) != v}


@pytest.fixture(scope="module")
def k_quant_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose rows divide into 256 (K-quant blocks) with 8 layers, so the
    layer-dependent rules (use_more_bits, first/last eighth) all show, and GQA 2."""
    require("torch", "the tiny model is built with torch")
    from edgekit.converters.convert import convert_model

    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("kquant")
    hf = build_tiny_model("llama", root / "hf", hidden=256, vocab_size=512, layers=8)
    out = root / "f32.gguf"
    convert_model(hf, "gguf", out, quant="F32")
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_gguf_layout_matches_llama_cpp_k_quant_shapes(k_quant_source: Path, fmt: str) -> None:
    require("llama_cpp", "quantizing needs llama.cpp")
    from edgekit.converters.gguf.quantize import quantize_gguf

    out = k_quant_source.parent / f"{fmt}.gguf"
    if not out.exists():
        quantize_gguf(k_quant_source, out, fmt)
    _check(k_quant_source, out, fmt)


@pytest.mark.parametrize("fmt", ("Q4_K_M", "Q2_K", "Q8_0"))
def test_gguf_layout_matches_llama_cpp_on_the_default_model(
    default_gguf: Path, tmp_path: Path, fmt: str
) -> None:
    """SmolLM2's rows (576) do not divide into 256: K-quants fall back to 32-blocks."""
    require("llama_cpp", "quantizing needs llama.cpp")
    from edgekit.converters.gguf.quantize import quantize_gguf

    out = tmp_path / f"{fmt}.gguf"
    quantize_gguf(default_gguf, out, fmt)
    _check(default_gguf, out, fmt)
    assert gguf_layout(inspect_model(default_gguf), fmt).total_bytes < out.stat().st_size


def test_the_default_model_file_is_its_own_layout(default_gguf: Path) -> None:
    """Q4_1 as llama.cpp wrote it for SmolLM2 (tied embeddings -> token_embd at Q8_0)."""
    _check(default_gguf, default_gguf, "Q4_1")


def test_q4_k_m_gives_more_bits_where_llama_cpp_does() -> None:
    # mistralai/Mistral-7B-v0.1's config.json, no weights
    spec = inspect_model(Path(__file__).parent.parent / "samples" / "configs" / "mistral-7b")
    layout = gguf_layout(spec, "Q4_K_M")
    kinds = {t.name: t.storage for t in layout.tensors}
    assert kinds["lm_head.weight"] == "Q6_K"
    assert kinds["model.embed_tokens.weight"] == "Q4_K"
    six = sorted(int(n.split(".")[2]) for n, k in kinds.items() if "v_proj" in n and k == "Q6_K")
    # use_more_bits(i, 32): the first and last 4 layers and every third one between
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    # TheBloke's mistral-7b-v0.1.Q4_K_M.gguf is 4.37 GB, metadata and vocabulary included
    assert 4.30e9 < layout.total_bytes < 4.37e9


def test_roles_from_both_naming_schemes() -> None:
    def role(name: str, shape: tuple[int, ...] = (8, 8)) -> str:
        return tensor_role(TensorInfo(name=name, shape=shape, dtype="F32", nbytes=0))

    assert role("model.layers.3.self_attn.v_proj.weight") == "attn_v"
    assert role("blk.3.attn_v.weight") == "attn_v"
    assert role("blk.3.attn_output.weight") == "attn_output"
    assert role("output.weight") == "output"
    assert role("model.layers.0.mlp.gate_up_proj.weight") == "ffn_up"
    assert role("model.layers.0.mlp.gate_proj.weight") == "ffn_gate"
    assert role("output_norm.weight", (8,)) == "vector"


def test_group_size_adjusts_like_nncf() -> None:
    scheme = IntScheme(bits=4, group=128, zero_point=True)
    # 576 columns: 128 does not divide, 64 does (9 groups per row)
    size, label = int_nbytes((10, 576), scheme) or (0, "")
    assert label == "INT4/g64"
    assert size == 10 * 576 // 2 + 10 * 9 * 2 + (10 * 9 + 1) // 2
    assert int_nbytes((4, 40), IntScheme(bits=4, group=32, zero_point=False)) is None


def _ir_weight_bytes(xml: Path) -> int:
    """Bytes of the IR's weight constants (everything but the small shape/index ones)."""
    total = 0
    for layer in ET.parse(xml).getroot().iter("layer"):
        data = layer.find("data")
        if layer.get("type") != "Const" or data is None:
            continue
        if data.get("element_type") in ("u4", "i4", "u8", "i8", "f16", "bf16", "f32"):
            total += int(data.get("size", "0"))
    return total


@pytest.mark.parametrize(
    ("family", "fmt"),
    [("llama", f) for f in ("F16", "INT8", "INT4", "INT4_SYM")]
    + [("qwen2", "INT4"), ("phi3", "INT4")],
)
def test_openvino_layout_matches_nncf(tmp_path: Path, family: str, fmt: str) -> None:
    require("optimum.intel", "the OpenVINO export needs optimum-intel")
    from edgekit.converters.convert import convert_model

    from tests.tiny_models import build_tiny_model

    hf = build_tiny_model(family, tmp_path / "hf", hidden=192)
    out = tmp_path / "ov"
    convert_model(hf, "openvino", out, quant=fmt)
    predicted = openvino_layout(inspect_model(hf), fmt).total_bytes
    actual = _ir_weight_bytes(out / "openvino_model.xml")
    # the IR also holds small float constants (rotary tables, eps): within 1%
    assert predicted == pytest.approx(actual, rel=0.01), (predicted, actual)


# --- the format packages: their quantizations and layouts --------------------------------

MISTRAL_7B = Path(__file__).parent.parent / "samples" / "configs" / "mistral-7b"


def test_gguf_format_offers_every_file_type_edgekit_writes() -> None:
    from edgekit.converters.gguf import FORMAT
    from edgekit.converters.gguf.table import GGUF_FORMATS, MEASURED_KL

    assert list(FORMAT.quants) == list(GGUF_FORMATS)
    assert (FORMAT.name, FORMAT.entry, FORMAT.default_quant) == ("gguf", "model.gguf", "F16")
    for name, row in GGUF_FORMATS.items():
        quant = FORMAT.quants[name]
        assert quant.bits_per_weight == row.bits_per_weight
        if name in ("F32", "F16", "BF16"):
            assert quant.lossless and quant.expected_kl == 0.0
        else:
            assert not quant.lossless and quant.expected_kl == MEASURED_KL.get(name)
    q4_1 = FORMAT.quants["Q4_1"]  # the default model's type: never measured
    assert (q4_1.expected_kl, q4_1.kl_source) == (None, "no measurement")
    assert FORMAT.quant("q4_k_m") is FORMAT.quants["Q4_K_M"]
    with pytest.raises(UnsupportedConversionError, match="GGUF has no format 'Q9'") as e:
        FORMAT.layout(inspect_model(MISTRAL_7B), "Q9")
    assert e.value.hint and "Q4_K_M" in e.value.hint


def test_gguf_format_layout_is_llama_cpps_and_a_built_file_is_its_own() -> None:
    from edgekit.converters.gguf import FORMAT

    spec = inspect_model(MISTRAL_7B)
    assert FORMAT.layout(spec, "q4_k_m") == gguf_layout(spec, "Q4_K_M")
    # F16 of a BF16 checkpoint: the same bytes, stored as the source's BF16
    assert spec.dtype == "BF16"
    assert FORMAT.layout(spec, "F16") == FORMAT.layout(spec, "BF16")


def test_built_gguf_layout_reads_the_files_tensors(tmp_path: Path) -> None:
    from edgekit.converters.gguf import FORMAT

    from tests.builders import full_tiny_gguf_tensors, gguf_bytes, tiny_gguf_metadata

    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes(tiny_gguf_metadata(), full_tiny_gguf_tensors()))
    spec = inspect_model(path)
    built = FORMAT.built_layout(spec, "q8_0")  # the file says F32 whatever the name asked
    assert built.format == "Q8_0"
    assert {t.storage for t in built.tensors} == {"F32"}
    assert built.total_bytes == sum(t.nbytes for t in spec.tensors)
    assert built != FORMAT.layout(spec, "Q8_0")


def test_openvino_format() -> None:
    from edgekit.converters.openvino import FORMAT

    assert (FORMAT.name, FORMAT.entry, FORMAT.default_quant) == ("openvino", "", "INT4")
    bits = {q.name: q.bits_per_weight for q in FORMAT.quants.values()}
    assert bits == {"F16": 16.0, "INT8": 8.0, "INT4": 4.6, "INT4_SYM": 4.3}
    assert FORMAT.quants["F16"].lossless and not FORMAT.quants["INT4"].lossless
    spec = inspect_model(MISTRAL_7B)
    assert FORMAT.layout(spec, "int4") == openvino_layout(spec, "INT4")
    assert FORMAT.layout(spec, "INT4", group_size=64) == openvino_layout(spec, "INT4", group_size=64)
    assert FORMAT.layout(spec, "INT4", group_size=64) != FORMAT.layout(spec, "INT4")


def test_prediction_only_formats_size_their_schemes_and_borrow_quality() -> None:
    from edgekit.converters.gguf import FORMAT as GGUF
    from edgekit.converters.mlx import FORMAT as MLX
    from edgekit.converters.openvino import FORMAT as OPENVINO
    from edgekit.converters.tensorrt import FORMAT as TENSORRT

    spec = inspect_model(MISTRAL_7B)
    # quality by analogy with the closest measured format, and said so
    assert TENSORRT.quants["INT4"].expected_kl == OPENVINO.quants["INT4"].expected_kl
    # MLX is built now (tests/test_mlx_convert.py): its KL is measured, and said so
    assert MLX.buildable and [e.output for e in MLX.edges()] == ["mlx"]
    assert MLX.quants["4BIT"].kl_source.startswith("measured (SmolLM2-135M")
    assert MLX.quants["4BIT"].expected_kl != GGUF.quants["Q4_0"].expected_kl
    assert MLX.quants["F16"].lossless
    # MLX's names, found in any case
    mlx = MLX.quant("8BIT")
    assert mlx is not None and mlx.name == "8BIT" and MLX.quant("8bit") is mlx
    assert MLX.layout(spec, "8BIT").format == "8BIT"

    def storage(fmt: Format, quant: str, role: str) -> str:
        return next(t.storage for t in fmt.layout(spec, quant).tensors if t.role == role)

    # TensorRT weight-only: the embedding and lm_head stay at f16
    assert storage(TENSORRT, "INT4", "ffn_up") == "INT4/g128"
    assert storage(TENSORRT, "INT4", "output") == "F16"
    # MLX: a float scale and bias per 64 weights, every matrix
    q = next(t for t in MLX.layout(spec, "4bit").tensors if t.role == "ffn_down")
    rows, cols = q.shape
    assert q.nbytes == rows * cols // 2 + rows * (cols // 64) * 4
    assert MLX.quants["4BIT"].bits_per_weight == 4.5
