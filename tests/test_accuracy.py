"""Accuracy checks: the method's fixed points, damage detection, the ordering of formats on
the embedded model, every target present, the CLI, and pack --max-quality-loss."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.errors import EvalError, QualityError
from tests.conftest import require

CTX, CHUNKS = 256, 4


@pytest.fixture(scope="module")
def source(
    smollm2_dequantized: Any, smollm2_f32_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The embedded model as a float32 HF folder and as an F32 GGUF (the reference): the
    session's conversions (tests/conftest.py), which these tests only read; "root" is this
    module's own folder for what it writes."""
    require("llama_cpp", "the reference runs in llama.cpp")
    root = tmp_path_factory.mktemp("accuracy")
    return {"hf": smollm2_dequantized.path, "f32": smollm2_f32_gguf, "root": root}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


def _llama(path: Path) -> Any:
    from edgekit.targets.llamacpp import LlamaCppTarget

    return LlamaCppTarget.load(path, logits=True, kv_cache="f32", context=CTX)


def _eval(path: Path, reference: Path | Remembered) -> Any:
    from edgekit.accuracy import evaluate

    if isinstance(reference, Remembered):
        with _llama(path) as model:
            return evaluate(model, reference, ctx=CTX, chunks=CHUNKS)
    with _llama(path) as model, _llama(reference) as ref:
        return evaluate(model, ref, ctx=CTX, chunks=CHUNKS)


class Remembered:
    """A logit source that computes each window once: llama.cpp's logits of a window are a
    function of its tokens (the session is reset before each, and the reference against
    itself scores a KL of exactly 0 across two sessions), so the F32 reference that five
    evaluations here score against on the same windows is run once per window, not five
    times (each window of the F32 model is seconds on the 2-core CI)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, dict[tuple[int, ...], np.ndarray]()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return list(self.inner.tokenize(text, add_special=add_special))

    def logits(self, tokens: list[int]) -> np.ndarray:
        key = tuple(tokens)
        if key not in self.seen:
            self.seen[key] = self.inner.logits(tokens)
            self.seen[key].flags.writeable = False  # shared between evaluations
        return self.seen[key]


@pytest.fixture(scope="module")
def f32_reference(source: dict[str, Path]) -> Iterator[Remembered]:
    """The F32 reference, loaded once for the module, each window's logits remembered."""
    with _llama(source["f32"]) as session:
        yield Remembered(session)


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


def test_formats_order_by_loss(quantized: dict[str, Path], f32_reference: Remembered) -> None:
    kl = {quant: _eval(path, f32_reference).kl_mean for quant, path in quantized.items()}
    assert 0 < kl["Q8_0"] < kl["Q4_K_M"] < kl["Q2_K"]


def test_a_damaged_model_is_caught(
    source: dict[str, Path],
    quantized: dict[str, Path],
    f32_reference: Remembered,
    tmp_path: Path,
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
    r = _eval(damaged, f32_reference)
    good = _eval(quantized["Q8_0"], f32_reference)
    assert r.kl_mean > 0.5 and r.top1_agreement < 0.8
    assert r.perplexity > 1.5 * r.reference_perplexity
    assert r.kl_mean > 20 * good.kl_mean  # damage, not quantization noise


def test_openvino_against_transformers(
    source: dict[str, Path], smollm2_openvino_int8: Path
) -> None:
    """The session's INT8 export of source["hf"] (tests/conftest.py) against transformers
    on that folder."""
    require("openvino_genai", "the OpenVINO target")
    from edgekit.targets.openvino import OpenVinoTarget

    from edgekit.accuracy import TransformersReference, evaluate

    reference = TransformersReference(source["hf"])
    with OpenVinoTarget.load(smollm2_openvino_int8, inference_precision="f32") as s:
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
    source: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit import bundle_quality
    from edgekit.bundle import VariantRequest, pack

    # The gate's decision, not its figure, is under test: half the windows of half the
    # length (Q2_K measures a KL of 0.34 against the 0.05 budget, Q8_0 0.004: far apart
    # at any length, docs/accuracy.md) cut the two F32 reference runs to a quarter.
    monkeypatch.setattr(bundle_quality, "GATE_CTX", CTX)
    monkeypatch.setattr(bundle_quality, "GATE_CHUNKS", CHUNKS // 2)

    with pytest.raises(QualityError) as info:
        pack(source["f32"], tmp_path / "b", [VariantRequest(quant="Q2_K")], max_quality_loss=0.05)
    assert "Q2_K measured a mean KL" in info.value.message
    assert "expected to meet it" in info.value.hint  # names a larger format from the table
    assert not (tmp_path / "b").exists()
    ok = pack(source["f32"], tmp_path / "c", [VariantRequest(quant="Q8_0")], max_quality_loss=0.05)
    q = ok.manifest.variants[0].quality
    assert q is not None and q.kl_mean <= 0.05
