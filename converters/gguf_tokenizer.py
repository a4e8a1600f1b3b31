"""A Hugging Face tokenizer.json as GGUF tokenizer metadata, and back.

Two tokenizer styles are supported, the two that the supported families use:

- byte-level BPE (GPT-2 style; Llama 3, Qwen, SmolLM): ``tokenizer.ggml.model = "gpt2"``,
  merges, and a pre-tokenizer name. llama.cpp picks its pre-tokenizer regex by that name,
  and a wrong or missing name loads fine and tokenizes wrongly, so the name is derived
  from the tokenizer.json's own pre-tokenizer and an unknown one is refused.
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Phi-3, Gemma):
  ``tokenizer.ggml.model = "llama"``, token scores, byte tokens.

Token types follow llama.cpp: added special tokens are CONTROL (so chat templates parse
them), other added tokens USER_DEFINED, ``<0xNN>`` BYTE, the unknown token UNKNOWN, padding
slots up to the model's vocabulary size UNUSED.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import UnsupportedConversionError

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

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True, kw_only=True)
class GgufVocab:
    model: str  # "gpt2" or "llama"
    pre: str | None  # llama.cpp pre-tokenizer name (byte-level BPE only)
    tokens: list[str]
    types: list[int]
    scores: list[float] | None


def _signature(pre: Any) -> Signature:
    if pre is None:
        return ()
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    sig: list[tuple[Any, ...]] = []
    for p in parts:
        kind = p.get("type")
        if kind == "ByteLevel":
            sig.append(("ByteLevel", bool(p.get("use_regex", True))))
        elif kind == "Digits":
            sig.append(("Digits", bool(p.get("individual_digits", False))))
        elif kind == "Split":
            pattern = p.get("pattern", {})
            sig.append(("Split", pattern.get("Regex", pattern.get("String")), p.get("behavior")))
        else:
            sig.append((kind,))
    return tuple(sig)


def read_vocab(folder: Path, vocab_size: int, *, pre_override: str | None = None) -> GgufVocab:
    """The GGUF vocabulary of a Hugging Face tokenizer.json, padded to ``vocab_size``.

    Raises:
        UnsupportedConversionError: no tokenizer.json, a tokenizer model other than BPE,
            or a byte-level pre-tokenizer edgekit does not know (pass ``pre_override``).
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedConversionError(
            f"{folder}: no tokenizer.json",
            hint="save the tokenizer with transformers (tokenizer.save_pretrained) first",
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model", {})
    if model.get("type") != "BPE":
        raise UnsupportedConversionError(
            f"{path}: tokenizer model {model.get('type')!r} is not supported",
            hint="edgekit converts BPE tokenizers (byte-level or SentencePiece-style)",
        )
    byte_fallback = bool(model.get("byte_fallback"))
    vocab: dict[str, int] = dict(model["vocab"])
    added = {t["id"]: t for t in data.get("added_tokens", [])}
    for t in added.values():
        vocab.setdefault(t["content"], t["id"])
    by_id = {i: tok for tok, i in vocab.items()}
    n = max(vocab_size, max(by_id) + 1)
    unk = model.get("unk_token")

    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        elif i in added:
            tokens.append(tok)
            types.append(TOKEN_CONTROL if added[i].get("special") else TOKEN_USER_DEFINED)
        elif byte_fallback and _BYTE_TOKEN.fullmatch(tok):
            tokens.append(tok)
            types.append(TOKEN_BYTE)
        elif tok == unk:
            tokens.append(tok)
            types.append(TOKEN_UNKNOWN)
        else:
            tokens.append(tok)
            types.append(TOKEN_NORMAL)
    if byte_fallback:
        # SentencePiece BPE scores a piece by its negative merge rank; HF keeps the piece
        # ids in that order, so -id reproduces the merge priority llama.cpp's SPM tokenizer
        # needs (the parity tests check tokenization against the HF tokenizer).
        scores = [-float(i) if t == TOKEN_NORMAL else 0.0 for i, t in enumerate(types)]
        return GgufVocab(model="llama", pre=None, tokens=tokens, types=types, scores=scores)

    signature = _signature(data.get("pre_tokenizer"))
    pre = pre_override or PRE_TOKENIZERS.get(signature)
    if pre is None:
        raise UnsupportedConversionError(
            f"{path}: unknown byte-level pre-tokenizer {signature!r}; llama.cpp would load the "
            "file and tokenize text wrongly",
            hint=f"pass the llama.cpp pre-tokenizer name (tokenizer_pre=...); known: "
            f"{', '.join(sorted(PRE_BY_NAME))}",
        )
    return GgufVocab(model="gpt2", pre=pre, tokens=tokens, types=types, scores=None)


def pre_tokenizer_json(pre: str) -> dict[str, Any]:
    """The tokenizer.json pre_tokenizer for a llama.cpp pre-tokenizer name.

    Raises:
        UnsupportedConversionError: a name edgekit cannot express as tokenizer.json.
    """
    signature = PRE_BY_NAME.get(pre)
    if signature is None:
        raise UnsupportedConversionError(
            f"GGUF pre-tokenizer {pre!r} cannot be written as a Hugging Face tokenizer yet",
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
