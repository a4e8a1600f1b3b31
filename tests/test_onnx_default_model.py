"""The embedded default model (SmolLM2-135M-Instruct) as the INT4 ONNX CPU variant, packed
once per module from edgekit's Hugging Face export of it: it generates coherent text through
``edgekit.load``, ``edgekit eval --json`` reports its KL against the source within a stated
bound, and ``edgekit bench --json`` measures it.

Slow (the ``default_gguf`` fixture marks it): about 50 s to build the variant, plus the
evaluation's fp32 reference and a short benchmark.
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
# INT4 build answers "The bees make a variety of products, but their most notable product
# is honey. Bees collect nectar from flowers, ..." (measured here, 60 tokens).
QUESTION = "What do bees make?"
EXPECTED_WORD = "honey"
ANSWER_TOKENS = 48
# A repetition loop: the same words again and again. The same build's answer to "What is
# the capital of France?" says "capital of France" four times in 60 tokens (a loop this
# check flags). The greedy answer depends on the CPU's INT4 kernels: the answer above was
# measured on an Intel CPU with AMX; on an AMD EPYC (AVX-512 VNNI) the same variant answers
# "Bees make a variety of delicious ... as well as various other products, including wax,
# pollen, and a variety of other ingredients", where the idiom "a variety of" comes three
# times across 48 tokens: coherent, not a loop. So a loop is a trigram that comes back
# MAX_TRIGRAM_REPEATS + 1 times within LOOP_WINDOW words, or an answer whose last
# LOOP_TAIL words repeat with a period of at most LOOP_PERIOD words.
MAX_TRIGRAM_REPEATS = 2
LOOP_WINDOW = 20
LOOP_TAIL, LOOP_PERIOD = 16, 8
MIN_DISTINCT_WORDS = 0.5


def loop_in(words: list[str]) -> str:
    """What makes ``words`` a repetition loop ("" when nothing does)."""
    for start in range(max(1, len(words) - LOOP_WINDOW + 1)):
        window = words[start : start + LOOP_WINDOW]
        trigrams = Counter(zip(window, window[1:], window[2:], strict=False))
        if trigrams and max(trigrams.values()) > MAX_TRIGRAM_REPEATS:
            return f"{trigrams.most_common(1)[0]} within {LOOP_WINDOW} words"
    tail = words[-LOOP_TAIL:]
    for period in range(1, LOOP_PERIOD + 1):
        if len(tail) == LOOP_TAIL and all(
            tail[i] == tail[i - period] for i in range(period, LOOP_TAIL)
        ):
            return f"ends repeating every {period} words"
    return ""


def _words(text: str) -> list[str]:
    return text.split()


def test_the_loop_check_flags_loops_and_passes_idioms() -> None:
    looping = _words("the capital of france is paris and the capital of france is paris and")
    assert loop_in(looping * 2)
    assert loop_in(_words("honey is sweet and") + ["honey", "is"] * 8)
    spread = _words("bees make a variety of foods such as honey which is a sweet liquid made")
    spread += _words("from nectar and a variety of flowers give them wax pollen and a variety of")
    assert not loop_in(spread)


# edgekit eval (the CLI's defaults but 2 windows of 256 tokens, to stay short), against the
# fp32 Hugging Face source through transformers. Measured here (ONNX INT4, blocks of 32):
# mean KL 0.355 nats/token, top-1 agreement 0.680, perplexity 18.2 against the source's
# 13.2 (512-token windows: KL 0.395, agreement 0.609; docs/onnx.md has the 512-token
# teacher-forced figures against the ONNX FP32 build: KL 0.485, agreement 0.62). The bounds
# leave ~1.7x on KL and 0.18 on agreement; what they exclude: weights that are not the
# model's (KL of several nats, agreement near 0) or a broken quantizer.
EVAL_CTX, EVAL_CHUNKS = 256, 2
MAX_KL, MIN_AGREEMENT, MAX_PERPLEXITY_RATIO = 0.6, 0.5, 2.0


@pytest.fixture(scope="module")
def smollm2_source(smollm2_dequantized: ConvertResult) -> Path:
    """The default model as edgekit's own Hugging Face export (``edgekit convert M.gguf --to
    hf``: the route ``pack`` takes from the GGUF), the variant's source and eval reference.
    Not the ``smollm2_hf`` fixture: transformers' GGUF loader writes a tokenizer_config
    naming CodeLlamaTokenizer, which the onnxruntime-genai builder re-saves as a Metaspace
    (SentencePiece-style) tokenizer.json over this byte-level BPE vocabulary; that
    variant tokenizes the Austen text into 26691 tokens instead of 15216 (measured here)."""
    require("torch", "the ONNX builder reads the Hugging Face folder with torch")
    require("onnxruntime_genai", "the ONNX variant runs on onnxruntime-genai")
    require("onnx_ir", "the onnxruntime-genai builder imports onnx_ir")
    return smollm2_dequantized.path


@pytest.fixture(scope="module")
def int4_bundle(smollm2_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgekit.targets.qnn import QnnTarget

    from edgekit.bundle import VariantRequest, pack

    out = tmp_path_factory.mktemp("smollm2-onnx") / "bundle"
    pack(smollm2_source, out, [VariantRequest(target=QnnTarget.name, quant="INT4")])
    return out


def _variant(bundle: Path) -> str:
    from edgekit.bundle_open import open_bundle

    (variant,) = open_bundle(bundle).manifest.variants
    assert (variant.format, variant.quant) == ("onnx", "INT4")
    return variant.name


def _invoke(*args: str) -> dict[str, object]:
    from edgekit.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_int4_variant_generates_coherent_text(int4_bundle: Path) -> None:
    import edgekit

    session = edgekit.load(int4_bundle, device="cpu")
    try:
        assert session.info.settings["execution_provider"] == "CPUExecutionProvider"
        reply = session.chat(
            [{"role": "user", "content": QUESTION}], max_tokens=ANSWER_TOKENS, temperature=0
        )
    finally:
        session.close()
    words = reply.text.lower().replace(",", " ").replace(".", " ").split()
    assert reply.completion_tokens >= 16, reply
    assert EXPECTED_WORD in words, reply.text
    assert not loop_in(words), (loop_in(words), reply.text)
    assert len(set(words)) >= MIN_DISTINCT_WORDS * len(words), reply.text


def test_eval_reports_kl_against_the_source(int4_bundle: Path, smollm2_source: Path) -> None:
    require("transformers", "the reference is the Hugging Face source run by transformers")
    data = _invoke(
        "eval", str(int4_bundle), "--reference", str(smollm2_source),
        "--ctx", str(EVAL_CTX), "--chunks", str(EVAL_CHUNKS), "--json",
    )  # fmt: skip
    assert data["variant"] == _variant(int4_bundle)
    assert data["tokens_scored"] == EVAL_CTX // 2 * EVAL_CHUNKS
    kl, agreement = data["kl_mean"], data["top1_agreement"]
    assert isinstance(kl, float) and 0 < kl <= MAX_KL, data
    assert isinstance(agreement, float) and MIN_AGREEMENT <= agreement <= 1, data
    ratio = float(data["perplexity"]) / float(data["reference_perplexity"])  # type: ignore[arg-type]
    assert 1 / MAX_PERPLEXITY_RATIO < ratio <= MAX_PERPLEXITY_RATIO, data


def test_bench_measures_it(int4_bundle: Path) -> None:
    data = _invoke(
        "bench", str(int4_bundle), "--prompt-lengths", "64", "--gen-tokens", "32",
        "--repeats", "2", "--warmup", "1", "--no-calibrate", "--json",
    )  # fmt: skip
    from edgekit.targets.qnn import QnnTarget

    assert (data["target"], data["quant"], data["variant"]) == (
        QnnTarget.name,
        "INT4",
        _variant(int4_bundle),
    )
    (run,) = data["runs"]  # type: ignore[misc]
    assert run["device"] == "cpu" and run["load_s"] > 0 and run["peak_rss_mb"] > 0
    (prefill,) = run["prefill"]
    assert prefill["prompt_tokens"] == 64
    assert prefill["tok_s"]["median"] > 0 and prefill["ttft_s"]["median"] > 0
    decode = run["decode"]
    # end-of-sequence ignored: every run makes 32 tokens, the rate counts those after the first
    assert decode["tokens"] == 31, decode
    assert decode["tok_s"]["median"] > 0 and decode["tok_s"]["n"] == 2
    assert set(data["includes"]) >= {"load_s", "ttft_s", "prefill_tok_s", "decode_tok_s"}
