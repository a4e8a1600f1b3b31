"""SentencePiece-style BPE (Llama 2, Mistral, Phi-3, Gemma): llama.cpp's space prefix for a
tokenizer.json pipeline, and the piece scores that make llama.cpp merge as the
tokenizer's merges do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.gguf.tokenizer.hf_json import describe, pattern_of, steps
from edgekit.converters.gguf.tokenizer.vocab import SPIECE, TOKEN_NORMAL, TOKEN_USER_DEFINED

from edgekit.errors import UnsupportedConversionError
from edgekit.untrusted import clean_text


@dataclass(frozen=True, kw_only=True)
class SpmPrefix:
    add: bool
    caveat: str | None  # why some texts tokenize differently in llama.cpp, or None: exact


def _refuse_pipeline(path: Path, what: str) -> UnsupportedConversionError:
    return UnsupportedConversionError(
        f"{path}: {what}: llama.cpp's SentencePiece tokenizer cannot do this, so the GGUF "
        "would load and tokenize text differently",
        hint="edgekit converts the SentencePiece pipelines of Llama 2, Mistral, Phi-3 and "
        "Gemma (Replace ' ' -> '▁', with or without Prepend '▁', or Metaspace)",
    )


def spm_prefix(data: dict[str, Any], path: Path) -> SpmPrefix:
    """llama.cpp's ``add_space_prefix`` for a SentencePiece-style tokenizer.json, and
    whether llama.cpp then tokenizes every text as it does."""
    normalizer = steps(data.get("normalizer"), "normalizers", path, "normalizer")
    pre = steps(data.get("pre_tokenizer"), "pretokenizers", path, "pre_tokenizer")
    replace = {"type": "Replace", "pattern": " ", "content": SPIECE}
    kinds = [
        {"type": s.get("type"), "pattern": pattern_of(s), "content": s.get("content")}
        if s.get("type") == "Replace"
        else {"type": s.get("type"), "prepend": s.get("prepend")}
        for s in normalizer
    ]
    if kinds == [{"type": "Prepend", "prepend": SPIECE}, replace]:
        prefix = True
    elif kinds == [replace]:
        prefix = False
    elif not kinds:
        prefix = False  # only a Metaspace pre-tokenizer can make this a SentencePiece pipeline
        if len(pre) != 1 or pre[0].get("type") != "Metaspace":
            raise _refuse_pipeline(path, "no normalizer and no Metaspace pre-tokenizer")
    else:
        raise _refuse_pipeline(path, "normalizer " + " + ".join(describe(s) for s in normalizer))

    if not pre:
        return SpmPrefix(add=prefix, caveat=None)
    if kinds and all(
        p.get("type") == "Split" and pattern_of(p) == " " and not p.get("invert") for p in pre
    ):
        # After Replace(" ", "▁") no space is left to split on (transformers 5's Gemma).
        return SpmPrefix(add=prefix, caveat=None)
    if len(pre) == 1 and pre[0].get("type") == "Metaspace" and not kinds:
        return _metaspace_prefix(pre[0], path)
    raise _refuse_pipeline(path, "pre-tokenizer " + " + ".join(describe(p) for p in pre))


def _metaspace_prefix(step: dict[str, Any], path: Path) -> SpmPrefix:
    if step.get("replacement") != SPIECE:
        raise _refuse_pipeline(
            path, f"Metaspace with replacement {clean_text(step.get('replacement'))!r}"
        )
    scheme = step.get("prepend_scheme")
    if scheme is None:  # tokenizers < 0.15 wrote add_prefix_space
        scheme = "always" if step.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never"):
        raise _refuse_pipeline(path, f"Metaspace prepend_scheme {clean_text(scheme)!r}")
    caveats = []
    if scheme != "never":
        caveats.append(
            "llama.cpp adds '▁' before a leading space, which Metaspace does not"
            + (
                ", and after every special token, which prepend_scheme 'first' does not"
                if scheme == "first"
                else ""
            )
        )
    if step.get("split", True):
        caveats.append(
            "Metaspace splits words at '▁' and llama.cpp does not, so runs of spaces may be "
            "merged differently"
        )
    caveat = None
    if caveats:
        caveat = (
            f"{path}: its Metaspace pre-tokenizer (prepend_scheme {scheme!r}) has no exact "
            f"llama.cpp equivalent: {'; '.join(caveats)}. Other text tokenizes identically."
        )
    return SpmPrefix(add=scheme != "never", caveat=caveat)


def spm_scores(
    tokens: Sequence[str], types: Sequence[int], merges: Iterable[tuple[str, str]]
) -> list[float]:
    """Scores that make llama.cpp's SentencePiece BPE merge in the order of ``merges``:
    a piece scores minus the rank of the first merge that produces it; a piece no merge
    produces scores below every merge (llama.cpp only reaches it if Hugging Face cannot)."""
    index = {t: i for i, t in enumerate(tokens)}
    rank: dict[int, int] = {}
    n = 0
    for n, (left, right) in enumerate(merges, start=1):
        i = index.get(left + right)
        if i is not None and i not in rank:
            rank[i] = n - 1
    floor = float(n)
    return [
        -float(rank[i])
        if i in rank
        else (-(floor + i) if t in (TOKEN_NORMAL, TOKEN_USER_DEFINED) else 0.0)
        for i, t in enumerate(types)
    ]


def unmerged_pieces(
    tokens: Sequence[str], types: Sequence[int], merges: Iterable[tuple[str, str]]
) -> list[str]:
    """Pieces llama.cpp can build from two pieces that Hugging Face never merges: llama.cpp
    merges any two adjacent pieces whose concatenation is in the vocabulary."""
    known = set(merges)
    index = {t: i for i, t in enumerate(tokens)}
    found = []
    for tok, kind in zip(tokens, types, strict=True):
        if kind not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(tok) < 2:
            continue
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in index and right in index and (left, right) not in known:
                found.append(tok)
                break
    return found

