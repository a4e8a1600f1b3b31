"""Accuracy checks: the method's fixed points, damage detection, the ordering of formats on
the embedded model, every target present, the CLI, and pack --max-quality-loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.errors import EvalError, QualityError
from tests.conftest import require

CTX, CHUNKS = 256, 4


@pytest.fixture(scope="module")
def source(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The embedded model as a float32 HF folder and as an F32 GGUF (the reference)."""
    require("llama_cpp", "the reference runs in llama.cpp")
    from edgekit.converters.convert import convert_model

    root = tmp_path_factory.mktemp("accuracy")
    convert_model(default_gguf, "hf", root / "hf")
    convert_model(root / "hf", "gguf", root / "f32.gguf", quant="F32")
    return {"hf": root / "hf", "f32": root / "f32.gguf", "root": root}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


def _llama(path: Path) -> Any:
    from edgekit.targets.llamacpp import LlamaCppTarget

    return LlamaCppTarget.load(path, logits=True, kv_cache="f32", context=CTX)


def _eval(path: Path, reference: Path) -> Any:
    from edgekit.accuracy import evaluate

    with _llama(path) as model, _llama(reference) as ref:
        return evaluate(model, ref, ctx=CTX, chunks=CHUNKS)


def test_the_reference_against_itself(source: dict[str, Path]) -> None:
    r = _eval(source["f32"], source["f32"])
    assert r.kl_mean == 0.0 and r.kl_p99 == 0.0 and r.top1_agreement == 1.0
    assert r.perplexity == pytest.approx(r.reference_perplexity)
    assert r.tokens_scored == CHUNKS * CTX // 2
    assert 10 < r.perplexity < 40  # SmolLM2 on Austen: ~17-18


@pytest.fixture(scope="module")
def quantized(source: dict[str, Path]) -> dict[str, Path]:
    """The embedded model quantized from its float32 export to three GGUF types."""
    from edgekit.converters.convert import convert_model

    paths = {}
    for quant in ("Q8_0", "Q4_K_M", "Q2_K"):
        paths[quant] = source["root"] / f"{quant}.gguf"
        convert_model(source["hf"], "gguf", paths[quant], quant=quant)
    return paths


def test_formats_order_by_loss(source: dict[str, Path], quantized: dict[str, Path]) -> None:
    kl = {quant: _eval(path, source["f32"]).kl_mean for quant, path in quantized.items()}
    assert 0 < kl["Q8_0"] < kl["Q4_K_M"] < kl["Q2_K"]


def test_a_damaged_model_is_caught(
    source: dict[str, Path], quantized: dict[str, Path], tmp_path: Path
) -> None:
    from edgekit.gguf_header import read_gguf_header

    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(source["f32"].read_bytes())
    header = read_gguf_header(damaged)
    tensor = next(t for t in header.tensors if t.name == "blk.3.ffn_down.weight")
    data = np.memmap(
        damaged,
        dtype=np.float32,
        mode="r+",
        offset=header.tensor_offsets[tensor.name],
        shape=(tensor.nbytes // 4,),
    )
    data[:] = np.random.default_rng(0).standard_normal(data.shape).astype(np.float32)
    data.flush()
    del data
    r = _eval(damaged, source["f32"])
    good = _eval(quantized["Q8_0"], source["f32"])
    assert r.kl_mean > 0.5 and r.top1_agreement < 0.8
    assert r.perplexity > 1.5 * r.reference_perplexity
    assert r.kl_mean > 20 * good.kl_mean  # damage, not quantization noise


def test_openvino_against_transformers(source: dict[str, Path], tmp_path: Path) -> None:
    require("openvino_genai", "the OpenVINO target")
    from edgekit.converters.convert import convert_model
    from edgekit.targets.openvino import OpenVinoTarget

    from edgekit.accuracy import TransformersReference, evaluate

    convert_model(source["hf"], "openvino", tmp_path / "ov", quant="INT8")
    reference = TransformersReference(source["hf"])
    with OpenVinoTarget.load(tmp_path / "ov", inference_precision="f32") as s:
        r = evaluate(s, reference, ctx=CTX, chunks=2)
    assert 0 < r.kl_mean < 0.05 and r.top1_agreement > 0.9


def test_refusals(source: dict[str, Path], tmp_path: Path) -> None:
    from edgekit.accuracy import evaluate
    from tests.tiny_models import build_tiny_model

    with _llama(source["f32"]) as model:
        with pytest.raises(EvalError, match="one window"):
            evaluate(model, model, text="Too short.", ctx=CTX)
        tiny = build_tiny_model("llama", tmp_path / "tiny")
        from edgekit.accuracy import TransformersReference

        with pytest.raises(EvalError, match="tokenize the text differently"):
            evaluate(model, TransformersReference(tiny), ctx=CTX, chunks=1)


def test_cli_eval_records_in_the_manifest(source: dict[str, Path], tmp_path: Path) -> None:
    from edgekit.converters.planner import quality

    from edgekit.bundle import VariantRequest, pack
    from edgekit.bundle_open import open_bundle

    bundle = pack(source["hf"], tmp_path / "b", [VariantRequest(quant="Q4_K_M")]).path
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgekit",
            "eval",
            str(bundle),
            "--reference",
            str(source["f32"]),
            "--ctx",
            str(CTX),
            "--chunks",
            "2",
            "--record",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["variant"] == "gguf-q4_k_m" and figures["kl_mean"] > 0
    recorded = open_bundle(bundle).manifest.variant("gguf-q4_k_m").quality
    assert recorded is not None and recorded.kl_mean == pytest.approx(figures["kl_mean"])
    assert quality.expected_kl("llamacpp", "Q4_K_M") == (
        pytest.approx(figures["kl_mean"]),
        "measured here (edgekit eval)",
    )


def test_pack_rejects_a_variant_over_the_quality_budget(
    source: dict[str, Path], tmp_path: Path
) -> None:
    from edgekit.bundle import VariantRequest, pack

    with pytest.raises(QualityError) as info:
        pack(source["f32"], tmp_path / "b", [VariantRequest(quant="Q2_K")], max_quality_loss=0.05)
    assert "Q2_K measured a mean KL" in info.value.message
    assert "expected to meet it" in info.value.hint  # names a larger format from the table
    assert not (tmp_path / "b").exists()
    ok = pack(source["f32"], tmp_path / "c", [VariantRequest(quant="Q8_0")], max_quality_loss=0.05)
    q = ok.manifest.variants[0].quality
    assert q is not None and q.kl_mean <= 0.05
