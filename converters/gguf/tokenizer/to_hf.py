"""GGUF tokenizer metadata -> a Hugging Face tokenizer.json and tokenizer_config.json
that tokenize as llama.cpp does with the GGUF."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgekit.converters.gguf.tokenizer.byte_level import pre_tokenizer_json
from edgekit.converters.gguf.tokenizer.specials import phi3_rstrip_ids
from edgekit.converters.gguf.tokenizer.vocab import (
    ADDS_BOS_BY_DEFAULT,
    IGNORES_MERGES,
    PHI3_NAME_MARKERS,
    SPIECE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
)

from edgekit.errors import ModelFormatError, UnsupportedConversionError
from edgekit.untrusted import clean_text


def sentencepiece_merges(
    tokens: Sequence[str], types: Sequence[int], scores: Sequence[float]
) -> list[list[str]]:
    """Merges that make Hugging Face's BPE join pieces as llama.cpp's SentencePiece BPE
    does: every split of a piece into two pieces, the highest-scoring piece first (the
    order SentencePiece's own extractor writes)."""
    mergeable = (TOKEN_NORMAL, TOKEN_USER_DEFINED)
    index = {t: i for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k in mergeable}
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for piece, i in index.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            li, ri = index.get(left), index.get(right)
            if li is not None and ri is not None:
                ranked.append((-scores[i], i, li, ri, left, right))
    ranked.sort()
    return [[left, right] for *_, left, right in ranked]


def _header_list(header: Any, key: str, kind: type, n: int | None) -> list[Any] | None:
    value = header.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    ):
        raise ModelFormatError(f"{header.path}: {key} is not a list of {kind.__name__}")
    if n is not None and len(value) != n:
        raise ModelFormatError(f"{header.path}: {key} has {len(value)} entries for {n} tokens")
    return value


def llamacpp_add_bos_default(model: str, pre: str | None) -> bool:
    """What llama.cpp does when a GGUF has no add_bos_token key."""
    return model == "llama" or pre in ADDS_BOS_BY_DEFAULT


def hf_tokenizer_files(header: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer.json and tokenizer_config.json that tokenize as the GGUF does in llama.cpp.

    Raises:
        UnsupportedConversionError: a tokenizer model or pre-tokenizer edgekit cannot write.
        ModelFormatError: tokenizer arrays of the wrong type or length.
    """
    model = header.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedConversionError(
            f"{header.path}: GGUF tokenizer {clean_text(model)!r} cannot be written as a "
            "Hugging Face tokenizer",
            hint="byte-level BPE (gpt2) and SentencePiece-style BPE (llama) GGUFs are supported",
        )
    tokens = _header_list(header, "tokenizer.ggml.tokens", str, None)
    if not tokens:
        raise ModelFormatError(f"{header.path}: no tokenizer.ggml.tokens")
    if len(set(tokens)) != len(tokens):
        raise ModelFormatError(f"{header.path}: a token appears twice in tokenizer.ggml.tokens")
    types = _header_list(header, "tokenizer.ggml.token_type", int, len(tokens))
    types = types or [TOKEN_NORMAL] * len(tokens)
    pre = header.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else None
    add_bos = _flag(header, "add_bos_token", llamacpp_add_bos_default(model, pre))
    add_eos = _flag(header, "add_eos_token", False)
    specials = _special_tokens(header, model, tokens)
    bos, eos = specials["bos"], specials["eos"]
    post_processor = _post_processor(tokens, bos if add_bos else None, eos if add_eos else None)
    if model == "llama":
        tokenizer = _sentencepiece_tokenizer(header, tokens, types, specials["unk"])
    else:
        tokenizer = _byte_level_tokenizer(header, tokens, pre or "gpt-2")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(header, tokens, types),
        **tokenizer,
        "post_processor": post_processor,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": specials["unk"],
        "pad_token": specials["pad"],
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(
            header.get(f"{header.get('general.architecture')}.context_length", 4096)
        ),
    }
    return tokenizer, config


def _flag(header: Any, key: str, default: bool) -> bool:
    value = header.get(f"tokenizer.ggml.{key}")
    return value if isinstance(value, bool) else default


def _special_tokens(header: Any, model: str, tokens: list[str]) -> dict[str, str | None]:
    """bos/eos/unk/pad as token texts (llama.cpp's defaults for a SentencePiece GGUF
    without the keys)."""
    defaults = {"bos": 1, "eos": 2, "unk": 0} if model == "llama" else {}
    keys = {
        "bos": "bos_token_id",
        "eos": "eos_token_id",
        "unk": "unknown_token_id",
        "pad": "padding_token_id",
    }
    found: dict[str, str | None] = {}
    for kind, key in keys.items():
        value = header.get(f"tokenizer.ggml.{key}", defaults.get(kind))
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens)
        found[kind] = str(tokens[value]) if ok else None
    return found


def _added_tokens(header: Any, tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    """Control, user-defined and unknown tokens as tokenizer.json's added tokens, with
    rstrip where llama.cpp's Phi-3 name rule strips."""
    name = header.get("general.name")
    stripped: set[int] = set()
    if isinstance(name, str) and any(m in name.lower() for m in PHI3_NAME_MARKERS):
        stripped = phi3_rstrip_ids(tokens, types) or set()
    return [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": i in stripped,
            "normalized": False,
            "special": types[i] != TOKEN_USER_DEFINED,
        }
        for i, tok in enumerate(tokens)
        if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
    ]


def _sentencepiece_tokenizer(
    header: Any, tokens: list[str], types: list[int], unk: str | None
) -> dict[str, Any]:
    scores = _header_list(header, "tokenizer.ggml.scores", float, len(tokens))
    if scores is None:
        raise ModelFormatError(f"{header.path}: a SentencePiece GGUF without token scores")
    prefix = _flag(header, "add_space_prefix", True)
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE}
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPIECE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "normalizer": (
            {
                "type": "Sequence",
                "normalizers": [{"type": "Prepend", "prepend": SPIECE}, replace],
            }
            if prefix
            else replace
        ),
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": sentencepiece_merges(tokens, types, scores),
        },
    }


def _byte_level_tokenizer(header: Any, tokens: list[str], pre: str) -> dict[str, Any]:
    merges = _header_list(header, "tokenizer.ggml.merges", str, None) or []
    return {
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_json(pre),
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in IGNORES_MERGES,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }


def _post_processor(tokens: list[str], bos: str | None, eos: str | None) -> dict[str, Any]:
    def special(tok: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": tok, "type_id": type_id}}

    def seq(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    single = [*([special(bos, 0)] if bos else []), seq("A", 0), *([special(eos, 0)] if eos else [])]
    pair = [
        *single,
        *([special(bos, 1)] if bos else []),
        seq("B", 1),
        *([special(eos, 1)] if eos else []),
    ]
    specials = {t: {"id": t, "ids": [tokens.index(t)], "tokens": [t]} for t in {bos, eos} if t}
    return {
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    }


def dump_tokenizer(tokenizer: dict[str, Any]) -> str:
    return json.dumps(tokenizer, ensure_ascii=False)
