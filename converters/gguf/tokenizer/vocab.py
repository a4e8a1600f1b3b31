"""The GGUF vocabulary edgekit writes, and the llama.cpp facts the tokenizer code keys on:
token types, pre-tokenizer names, the Phi-3 name rule, size caps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SPIECE = "\u2581"  # SentencePiece's visible space, "▁"
# Larger than any real tokenizer.json (Gemma 3's, 262k tokens, is about 33 MB).
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024

# tokenizer.json pre-tokenizer, reduced to a signature -> llama.cpp's pre-tokenizer name.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
Signature = tuple[tuple[Any, ...], ...]
PRE_TOKENIZERS: dict[Signature, str] = {
    (("ByteLevel", True),): "gpt-2",
    (("Digits", True), ("ByteLevel", True)): "smollm",
    (("Split", _LLAMA3_SPLIT, "Isolated"), ("ByteLevel", False)): "llama-bpe",
    (("Split", _QWEN2_SPLIT, "Isolated"), ("ByteLevel", False)): "qwen2",
}
PRE_BY_NAME: dict[str, Signature] = {v: k for k, v in PRE_TOKENIZERS.items()}
# llama.cpp's pre-tokenizers that use a whole word found in the vocabulary as it is
# (tokenizer.json's ``ignore_merges``) and that add BOS when the file does not say.
IGNORES_MERGES = frozenset({"llama-bpe"})
ADDS_BOS_BY_DEFAULT = frozenset({"llama-bpe"})

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# llama.cpp lowercases general.name and applies Phi-3's rstrip rule when it contains one of
# these (llama-vocab.cpp, "set attributes by model/tokenizer/architecture name").
PHI3_NAME_MARKERS = ("phi-3", "phi3")


@dataclass(frozen=True, kw_only=True)
class AddedToken:
    id: int
    content: str
    special: bool
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


@dataclass(frozen=True, kw_only=True)
class GgufVocab:
    """Everything the GGUF's ``tokenizer.*`` keys hold."""

    model: str  # "gpt2" or "llama"
    pre: str | None  # llama.cpp pre-tokenizer name (byte-level BPE only)
    tokens: list[str]
    types: list[int]
    scores: list[float] | None  # SentencePiece-style only
    merges: list[str]  # byte-level only: "left right"
    add_space_prefix: bool | None  # SentencePiece-style only
    add_bos: bool
    add_eos: bool
    special_ids: dict[str, int]  # "bos", "eos", "unk", "pad" -> id
    chat_template: str | list[dict[str, str]] | None
    phi3_rstrip: bool  # the tokenizer's strip flags are llama.cpp's Phi-3 rule
    warnings: tuple[str, ...]

