"""HF -> GGUF conversion checked against transformers on CPU, for every supported family.

Tolerances (stated here, measured in the commit that set them):
- F32 GGUF, F32 KV cache: max |logit difference| <= 1e-3 x max |reference logit|
  (measured: about 1e-5), argmax equal at every position.
- F16 GGUF: <= 1e-2 x max |reference logit| (measured: 1e-3 to 2.5e-3), argmax equal at
  every position whose reference top-2 margin exceeds twice the largest error seen (f16
  weights may legitimately flip a closer tie; at least 80% of positions must qualify).
- Q8_0 / Q4_K_M on hidden-size-256 models (so K-quants apply to every row): top-1
  agreement and mean KL divergence over a 280-token passage within the bounds below.
  Random weights have no outlier structure and quantize worse than trained models; the
  bounds leave room for that, not for a broken converter (a missed Q/K permutation gives
  agreement near 1/vocabulary).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require
from tests.tiny_models import FAMILIES, training_text

PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
TEXTS = [
    PROMPT,
    "  Two  spaces, tabs\tand\nnew lines; digits 12345 and ünïcödé: café, naïve.",
    "<|im_start|>user\nHello there<|im_end|>\n",
]
QUANT_BOUNDS = {"Q8_0": (0.85, 0.01), "Q4_K_M": (0.45, 0.1)}  # (min agreement, max mean KL)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require("torch", "tiny models are built with transformers")
    require("transformers", "tiny models are built with transformers")
    require("llama_cpp", "the GGUF runtime is llama-cpp-python")
    from tests.tiny_models import build_tiny_model

    cache: dict[tuple[str, int], Path] = {}

    def get(family: str, hidden: int = 64) -> Path:
        key = (family, hidden)
        if key not in cache:
            cache[key] = build_tiny_model(
                family, tmp_path_factory.mktemp(f"{family}-{hidden}"), hidden=hidden
            )
        return cache[key]

    return get


def _reference(src: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _hf_ids(src: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(src)(text)["input_ids"])


def _convert(src: Path, out: Path, quant: str) -> Path:
    from edgekit.converters.convert import convert_model

    convert_model(src, "gguf", out, quant=quant)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(
    ("quant", "kv_cache", "rel_tol"), [("F32", "f32", 1e-3), ("F16", "f16", 1e-2)]
)
def test_float_gguf_matches_transformers(
    tiny_models, tmp_path: Path, family: str, quant: str, kv_cache: str, rel_tol: float
) -> None:  # type: ignore[no-untyped-def]
    from edgekit.targets.llamacpp import LlamaCppTarget

    src = tiny_models(family)
    gguf = _convert(src, tmp_path / f"{family}.gguf", quant)
    with LlamaCppTarget.load(gguf, logits=True, kv_cache=kv_cache) as session:
        for text in TEXTS:
            assert session.tokenize(text) == _hf_ids(src, text), text
        ids = _hf_ids(src, PROMPT)
        got = session.logits(ids)
    ref = _reference(src, ids)
    assert got.shape == ref.shape
    bound = rel_tol * np.abs(ref).max()
    assert np.abs(got - ref).max() <= bound
    if quant == "F32":
        assert (got.argmax(-1) == ref.argmax(-1)).all()
    else:
        # Rounding the weights to f16 may flip a near-tie; every position whose top-2
        # margin exceeds twice the largest error seen must agree, and nearly all qualify.
        top2 = np.sort(ref, -1)[:, -2:]
        decisive = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(got - ref).max()
        assert decisive.mean() >= 0.8
        assert (got.argmax(-1) == ref.argmax(-1))[decisive].all()


def _kl_and_agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = log_softmax(ref.astype(np.float64)), log_softmax(got.astype(np.float64))
    kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    return kl, float((ref.argmax(-1) == got.argmax(-1)).mean())


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("quant", sorted(QUANT_BOUNDS))
def test_quantized_gguf_stays_close(tiny_models, tmp_path: Path, family: str, quant: str) -> None:  # type: ignore[no-untyped-def]
    from edgekit.targets.llamacpp import LlamaCppTarget

    from edgekit.gguf_header import read_gguf_header

    src = tiny_models(family, 256)
    gguf = _convert(src, tmp_path / f"{family}-{quant}.gguf", quant)
    header = read_gguf_header(gguf)
    assert {t.dtype for t in header.tensors if len(t.shape) > 1} - {"F32", "F16"}, (
        "weights are quantized"
    )
    ids = _hf_ids(src, training_text()[2000:2600])
    with LlamaCppTarget.load(gguf, logits=True) as session:
        got = session.logits(ids)
        generation = session.generate(PROMPT, max_tokens=8, temperature=0)
    kl, agreement = _kl_and_agreement(_reference(src, ids), got)
    min_agreement, max_kl = QUANT_BOUNDS[quant]
    assert agreement >= min_agreement
    assert kl <= max_kl
    assert generation.completion_tokens > 0


def test_llama3_rope_scaling_is_written(tiny_models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A Llama 3.1-style RoPE config produces rope_freqs and still matches transformers."""
    import json
    import shutil

    from edgekit.targets.llamacpp import LlamaCppTarget

    src = tmp_path / "llama3"
    shutil.copytree(tiny_models("llama"), src)
    config = json.loads((src / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_theta"] = 500000.0
    config["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (src / "config.json").write_text(json.dumps(config))
    gguf = _convert(src, tmp_path / "llama3.gguf", "F32")
    ids = _hf_ids(src, PROMPT)
    with LlamaCppTarget.load(gguf, logits=True, kv_cache="f32") as session:
        got = session.logits(ids)
    ref = _reference(src, ids)
    assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()
