"""Byte-level BPE (GPT-2 style; Llama 3, Qwen, SmolLM): llama.cpp's pre-tokenizer name
for a tokenizer.json's pre-tokenizer, and the tokenizer.json pre-tokenizer for a name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from edgekit.converters.gguf.tokenizer.hf_json import describe, pattern_of, steps
from edgekit.converters.gguf.tokenizer.vocab import (
    IGNORES_MERGES,
    PRE_BY_NAME,
    PRE_TOKENIZERS,
    Signature,
)

from edgekit.errors import UnsupportedConversionError
from edgekit.untrusted import clean_text

log = logging.getLogger(__name__)


def signature_of(pre: Any) -> Signature:
    if pre is None:
        return ()
    if not isinstance(pre, dict):
        return (("invalid",),)
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if not isinstance(parts, list):
        return (("invalid",),)
    sig: list[tuple[Any, ...]] = []
    for p in parts:
        if not isinstance(p, dict):
            sig.append(("invalid",))
            continue
        kind = p.get("type")
        if kind == "ByteLevel":
            sig.append(("ByteLevel", bool(p.get("use_regex", True))))
        elif kind == "Digits":
            sig.append(("Digits", bool(p.get("individual_digits", False))))
        elif kind == "Split":
            sig.append(("Split", pattern_of(p), p.get("behavior")))
        else:
            sig.append((kind,))
    return tuple(sig)


def byte_level_pre(
    data: dict[str, Any], model: dict[str, Any], path: Path, pre_override: str | None
) -> tuple[str, list[str]]:
    """llama.cpp's pre-tokenizer name for a byte-level tokenizer.json, and warnings."""
    warnings = []
    normalizer = steps(data.get("normalizer"), "normalizers", path, "normalizer")
    kinds = [s.get("type") for s in normalizer]
    if kinds == ["NFC"]:
        log.info(
            "%s: llama.cpp does not apply the NFC normalizer; text already in NFC (nearly "
            "all text) tokenizes identically",
            path,
        )
    elif kinds:
        raise UnsupportedConversionError(
            f"{path}: normalizer {' + '.join(describe(s) for s in normalizer)}: llama.cpp's "
            "byte-level tokenizer does not normalize, so the GGUF would tokenize text "
            "differently",
            hint="edgekit converts byte-level tokenizers without a normalizer, or with NFC",
        )
    signature = signature_of(data.get("pre_tokenizer"))
    pre = pre_override or PRE_TOKENIZERS.get(signature)
    if pre is None:
        raise UnsupportedConversionError(
            f"{path}: unknown byte-level pre-tokenizer {clean_text(signature)}; llama.cpp "
            "would load the file and tokenize text wrongly",
            hint=f"pass the llama.cpp pre-tokenizer name (tokenizer_pre=...); known: "
            f"{', '.join(sorted(PRE_BY_NAME))}",
        )
    ignores = bool(model.get("ignore_merges"))
    if pre in PRE_BY_NAME and ignores != (pre in IGNORES_MERGES):
        warnings.append(
            f"{path}: ignore_merges is {str(ignores).lower()} but llama.cpp's {pre!r} "
            f"pre-tokenizer {'does not ignore' if ignores else 'ignores'} merges: a word that "
            "is itself a token may tokenize differently"
        )
    return pre, warnings



def pre_tokenizer_json(pre: str) -> dict[str, Any]:
    """The tokenizer.json pre_tokenizer for a llama.cpp pre-tokenizer name.

    Raises:
        UnsupportedConversionError: a name edgekit cannot express as tokenizer.json.
    """
    signature = PRE_BY_NAME.get(pre)
    if signature is None:
        raise UnsupportedConversionError(
            f"GGUF pre-tokenizer {clean_text(pre)!r} cannot be written as a Hugging Face "
            "tokenizer yet",
            hint=f"supported: {', '.join(sorted(PRE_BY_NAME))}",
        )
    parts: list[dict[str, Any]] = []
    for part in signature:
        if part[0] == "ByteLevel":
            parts.append(
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": part[1],
                }
            )
        elif part[0] == "Digits":
            parts.append({"type": "Digits", "individual_digits": part[1]})
        elif part[0] == "Split":
            parts.append(
                {
                    "type": "Split",
                    "pattern": {"Regex": part[1]},
                    "behavior": part[2],
                    "invert": False,
                }
            )
    return parts[0] if len(parts) == 1 else {"type": "Sequence", "pretokenizers": parts}
