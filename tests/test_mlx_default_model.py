"""The embedded default model (SmolLM2-135M-Instruct) as a 4-bit MLX variant, packed once
per module from edgekit's Hugging Face export of it: it generates coherent text through
``edgekit.load`` (MLX's CPU backend here), ``edgekit eval --json`` reports its KL against
the source within a stated bound, and ``edgekit bench --json`` measures it.

4BIT at group 32, not mlx-lm's default 64: at 64 this 135M model's answers loop ("They're
so small that they're so small that ..." to the question below, measured here); at 32
they stay on topic (docs/mlx.md has both KL figures).

Slow (the ``default_gguf`` fixture marks it): MLX's CPU build decodes it at ~5 tok/s here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from tests.conftest import require

if TYPE_CHECKING:
    from edgekit.converters.convert import ConvertResult

# A question whose coherent answer names what it asks for (greedy, chat template). The
# 4BIT group-32 build answers "Bees make a variety of delicious and tasty products that are
# essential for their survival. ... they also produce a variety of honey, a type of
# honeycomb, and" (measured here, 48 tokens); the group-64 build loops.
QUESTION = "What do bees make?"
EXPECTED_WORD = "honey"
ANSWER_TOKENS = 48
MAX_TRIGRAM_REPEATS = 2
MIN_DISTINCT_WORDS = 0.5

# edgekit eval (1 window of 128 tokens, its last 64 scored: MLX's CPU build takes ~23 s
# for the window's logits here, transformers ~9 s), against the fp32 Hugging Face source
# through transformers. Measured here: mean KL 0.383 nats/token, top-1 agreement 0.594,
# perplexity 32.0 against the source's 25.1 (two windows: 0.334, 0.633, 25.7 / 19.0, for
# twice the time). The figures are deterministic (greedy logits of a fixed text); the
# bounds leave ~1.6x on KL and 0.09 on agreement; what they exclude: weights that are not
# the model's (KL of several nats, agreement near 0) or a broken quantizer.
EVAL_CTX, EVAL_CHUNKS = 128, 1
MAX_KL, MIN_AGREEMENT, MAX_PERPLEXITY_RATIO = 0.6, 0.5, 2.0


@pytest.fixture(scope="module")
def smollm2_source(smollm2_dequantized: ConvertResult) -> Path:
    """The default model as edgekit's own Hugging Face export (the route ``pack`` takes
    from the GGUF): the variant's source and the eval reference."""
    require("mlx_lm", "the variant is built and run by mlx-lm")
    return smollm2_dequantized.path


@pytest.fixture(scope="module")
def bundle_4bit(smollm2_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgekit.targets.mlx import MlxTarget

    from edgekit.bundle import VariantRequest, pack

    out = tmp_path_factory.mktemp("smollm2-mlx") / "bundle"
    request = VariantRequest(target=MlxTarget.name, quant="4BIT", recipe="group_size=32")
    pack(smollm2_source, out, [request])
    return out


def _variant(bundle: Path) -> str:
    from edgekit.bundle_open import open_bundle

    (variant,) = open_bundle(bundle).manifest.variants
    assert (variant.format, variant.quant) == ("mlx", "4BIT")
    return variant.name


def _invoke(*args: str) -> dict[str, object]:
    from edgekit.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_4bit_variant_generates_coherent_text(bundle_4bit: Path) -> None:
    import edgekit

    session = edgekit.load(bundle_4bit, device="cpu")
    try:
        reply = session.chat(
            [{"role": "user", "content": QUESTION}], max_tokens=ANSWER_TOKENS, temperature=0
        )
    finally:
        session.close()
    words = reply.text.lower().replace(",", " ").replace(".", " ").split()
    assert reply.completion_tokens >= 16, reply
    assert EXPECTED_WORD in words, reply.text
    trigrams = Counter(zip(words, words[1:], words[2:], strict=False))
    assert max(trigrams.values()) <= MAX_TRIGRAM_REPEATS, (trigrams.most_common(3), reply.text)
    assert len(set(words)) >= MIN_DISTINCT_WORDS * len(words), reply.text


def test_eval_reports_kl_against_the_source(bundle_4bit: Path, smollm2_source: Path) -> None:
    require("transformers", "the reference is the Hugging Face source run by transformers")
    data = _invoke(
        "eval", str(bundle_4bit), "--reference", str(smollm2_source),
        "--ctx", str(EVAL_CTX), "--chunks", str(EVAL_CHUNKS), "--json",
    )  # fmt: skip
    assert data["variant"] == _variant(bundle_4bit)
    assert data["tokens_scored"] == EVAL_CTX // 2 * EVAL_CHUNKS
    kl, agreement = data["kl_mean"], data["top1_agreement"]
    assert isinstance(kl, float) and 0 < kl <= MAX_KL, data
    assert isinstance(agreement, float) and MIN_AGREEMENT <= agreement <= 1, data
    ratio = float(data["perplexity"]) / float(data["reference_perplexity"])  # type: ignore[arg-type]
    assert 1 / MAX_PERPLEXITY_RATIO < ratio <= MAX_PERPLEXITY_RATIO, data


def test_bench_measures_it(bundle_4bit: Path) -> None:
    from edgekit.targets.mlx import MlxTarget

    # Short: every figure is checked for presence, shape and sign, not size, and MLX's CPU
    # build decodes ~5 tokens/s here (64 + 32 tokens took 44 s, 16 + 8 14 s).
    data = _invoke(
        "bench", str(bundle_4bit), "--prompt-lengths", "16", "--gen-tokens", "8",
        "--repeats", "2", "--warmup", "1", "--no-calibrate", "--json",
    )  # fmt: skip
    assert (data["target"], data["quant"], data["variant"]) == (
        MlxTarget.name,
        "4BIT",
        _variant(bundle_4bit),
    )
    (run,) = data["runs"]  # type: ignore[misc]
    assert run["device"] == "cpu" and run["load_s"] > 0 and run["peak_rss_mb"] > 0
    (prefill,) = run["prefill"]
    assert prefill["prompt_tokens"] == 16
    assert prefill["tok_s"]["median"] > 0 and prefill["ttft_s"]["median"] > 0
    decode = run["decode"]
    assert decode["tokens"] == 7, decode  # the tokens after the first
    assert decode["tok_s"]["median"] > 0 and decode["tok_s"]["n"] == 2
    assert set(data["includes"]) >= {"load_s", "ttft_s", "prefill_tok_s", "decode_tok_s"}
