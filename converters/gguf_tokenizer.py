"""A Hugging Face tokenizer.json as GGUF tokenizer metadata, and back: the one place that
decides how llama.cpp will tokenize.

A GGUF that loads can still tokenize differently from the Hugging Face tokenizer it came
from, and nothing fails: the model just sees other ids. So every key llama.cpp reads is
derived from what the tokenizer.json does, written explicitly (llama.cpp's defaults are
not the Hugging Face tokenizer's), and what llama.cpp cannot express is refused before a
byte is written, or, where only rare texts differ, said in a warning.

Two tokenizer styles, the two the supported families use:

- byte-level BPE (GPT-2 style; Llama 3, Qwen, SmolLM): ``tokenizer.ggml.model = "gpt2"``,
  merges, and a pre-tokenizer name. llama.cpp picks its split regex by that name, so the
  name is derived from the tokenizer.json's own pre-tokenizer, and an unknown one is
  refused. Normalizers: none, or NFC (Qwen), which llama.cpp does not apply (text that is
  already NFC, as nearly all text is, is unaffected).
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Phi-3, Gemma):
  ``tokenizer.ggml.model = "llama"``, token scores, byte tokens, and
  ``tokenizer.ggml.add_space_prefix``: llama.cpp prepends "▁" to the text and after every
  special token unless it is false. The Hugging Face pipelines and their llama.cpp value:
  ``Prepend("▁") + Replace(" ", "▁")`` (Llama 2, Mistral v0.1, Phi-3): true, exact;
  ``Replace(" ", "▁")`` alone, optionally followed by a ``Split(" ")`` that no longer finds
  a space (Gemma): false, exact; ``Metaspace`` with ``prepend_scheme`` never: false, exact;
  ``always``/``first``: true, with a warning (Metaspace adds no prefix before a leading
  space, ``first`` none after a special token; llama.cpp does). Anything else is refused.
  SentencePiece BPE merges by piece score; the scores are derived from the merge ranks
  (a piece scores minus the rank of the first merge that makes it), so llama.cpp merges
  in the order the Hugging Face BPE does.

Token types follow llama.cpp: added special tokens are CONTROL (chat templates parse them),
other added tokens USER_DEFINED (matched in text as Hugging Face matches added tokens),
the unknown token UNKNOWN when it is an added token, ``<0xNN>`` BYTE, padding slots up
to the model's vocabulary size UNUSED. llama.cpp ignores tokenizer.json's lstrip/rstrip
flags except through one rule keyed on ``general.name`` (Phi-3's: rstrip on its chat
tokens and ``</s>``); the writer names the file so that the rule applies exactly when the
tokenizer's flags are Phi-3's (``general_name``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.errors import ModelFormatError, UnsupportedConversionError
from edgekit.untrusted import clean_text, parse_json

if TYPE_CHECKING:
    import gguf

log = logging.getLogger(__name__)

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
_IGNORES_MERGES = frozenset({"llama-bpe"})
_ADDS_BOS_BY_DEFAULT = frozenset({"llama-bpe"})

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# llama.cpp lowercases general.name and applies Phi-3's rstrip rule when it contains one of
# these (llama-vocab.cpp, "set attributes by model/tokenizer/architecture name").
PHI3_NAME_MARKERS = ("phi-3", "phi3")
_PHI3_NOT_STRIPPED = ("<unk>", "<s>", "<|endoftext|>")
_PHI3_STRIPPED = ("</s>",)


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


# --- reading the Hugging Face files -----------------------------------------------------


def _load_json(path: Path, max_bytes: int) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot be read ({exc.strerror})") from exc
    return parse_json(
        raw,
        where=str(path),
        max_bytes=max_bytes,
        max_depth=None,
        error=ModelFormatError,
        hint="save the tokenizer again with transformers (tokenizer.save_pretrained)",
    )


def _bad(path: Path, what: str) -> ModelFormatError:
    return ModelFormatError(
        f"{path}: {what}", hint="save the tokenizer again with transformers (save_pretrained)"
    )


def _as_dict(value: Any, path: Path, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(path, f"{what} is not an object")
    return value


def _vocab(model: dict[str, Any], path: Path) -> dict[str, int]:
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise _bad(path, "model.vocab is not an object of token -> id")
    for token, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise _bad(path, f"token {clean_text(token)!r} has the id {clean_text(i)!r}")
    return vocab


def _merges(model: dict[str, Any], path: Path) -> list[tuple[str, str]]:
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        raise _bad(path, "model.merges is not a list")
    out: list[tuple[str, str]] = []
    for m in merges:
        pair = m.split(" ") if isinstance(m, str) else m
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(p, str) and p for p in pair)
        ):
            raise _bad(path, f"merge {clean_text(m)!r} is not two tokens")
        out.append((pair[0], pair[1]))
    return out


def _added(data: dict[str, Any], path: Path) -> list[AddedToken]:
    items = data.get("added_tokens") or []
    if not isinstance(items, list):
        raise _bad(path, "added_tokens is not a list")
    out = []
    for t in items:
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("id"), int)
            or isinstance(t.get("id"), bool)
            or t["id"] < 0
            or not isinstance(t.get("content"), str)
            or not t["content"]
        ):
            raise _bad(path, f"added token {clean_text(t)!r} needs an id and a content")
        out.append(
            AddedToken(
                id=t["id"],
                content=t["content"],
                special=bool(t.get("special")),
                lstrip=bool(t.get("lstrip")),
                rstrip=bool(t.get("rstrip")),
                single_word=bool(t.get("single_word")),
            )
        )
    return out


def _steps(component: Any, key: str, path: Path, what: str) -> list[dict[str, Any]]:
    """A normalizer or pre-tokenizer as a flat list of steps (Sequences unrolled)."""
    if component is None:
        return []
    node = _as_dict(component, path, what)
    if node.get("type") == "Sequence":
        parts = node.get(key)
        if not isinstance(parts, list):
            raise _bad(path, f"{what} Sequence has no {key} list")
        return [s for p in parts for s in _steps(p, key, path, what)]
    return [node]


def _pattern(step: dict[str, Any]) -> Any:
    pattern = step.get("pattern")
    if isinstance(pattern, dict):
        return pattern.get("String", pattern.get("Regex"))
    return None


def _describe(step: dict[str, Any]) -> str:
    kind = step.get("type")
    pattern = _pattern(step)
    return clean_text(f"{kind}({pattern!r})" if pattern is not None else f"{kind}")


# --- the SentencePiece-style pipeline -----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Prefix:
    add: bool
    caveat: str | None  # why some texts tokenize differently in llama.cpp, or None: exact


def _refuse_pipeline(path: Path, what: str) -> UnsupportedConversionError:
    return UnsupportedConversionError(
        f"{path}: {what}: llama.cpp's SentencePiece tokenizer cannot do this, so the GGUF "
        "would load and tokenize text differently",
        hint="edgekit converts the SentencePiece pipelines of Llama 2, Mistral, Phi-3 and "
        "Gemma (Replace ' ' -> '▁', with or without Prepend '▁', or Metaspace)",
    )


def _spm_prefix(data: dict[str, Any], path: Path) -> _Prefix:
    """llama.cpp's ``add_space_prefix`` for a SentencePiece-style tokenizer.json, and
    whether llama.cpp then tokenizes every text as it does."""
    normalizer = _steps(data.get("normalizer"), "normalizers", path, "normalizer")
    pre = _steps(data.get("pre_tokenizer"), "pretokenizers", path, "pre_tokenizer")
    replace = {"type": "Replace", "pattern": " ", "content": SPIECE}
    kinds = [
        {"type": s.get("type"), "pattern": _pattern(s), "content": s.get("content")}
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
        raise _refuse_pipeline(path, "normalizer " + " + ".join(_describe(s) for s in normalizer))

    if not pre:
        return _Prefix(add=prefix, caveat=None)
    if kinds and all(
        p.get("type") == "Split" and _pattern(p) == " " and not p.get("invert") for p in pre
    ):
        # After Replace(" ", "▁") no space is left to split on (transformers 5's Gemma).
        return _Prefix(add=prefix, caveat=None)
    if len(pre) == 1 and pre[0].get("type") == "Metaspace" and not kinds:
        return _metaspace_prefix(pre[0], path)
    raise _refuse_pipeline(path, "pre-tokenizer " + " + ".join(_describe(p) for p in pre))


def _metaspace_prefix(step: dict[str, Any], path: Path) -> _Prefix:
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
    return _Prefix(add=scheme != "never", caveat=caveat)


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


def _unmerged_pieces(
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


# --- byte-level BPE --------------------------------------------------------------------


def _signature(pre: Any) -> Signature:
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
            sig.append(("Split", _pattern(p), p.get("behavior")))
        else:
            sig.append((kind,))
    return tuple(sig)


def _byte_level(
    data: dict[str, Any], model: dict[str, Any], path: Path, pre_override: str | None
) -> tuple[str, list[str]]:
    """llama.cpp's pre-tokenizer name for a byte-level tokenizer.json, and warnings."""
    warnings = []
    normalizer = _steps(data.get("normalizer"), "normalizers", path, "normalizer")
    kinds = [s.get("type") for s in normalizer]
    if kinds == ["NFC"]:
        log.info(
            "%s: llama.cpp does not apply the NFC normalizer; text already in NFC (nearly "
            "all text) tokenizes identically",
            path,
        )
    elif kinds:
        raise UnsupportedConversionError(
            f"{path}: normalizer {' + '.join(_describe(s) for s in normalizer)}: llama.cpp's "
            "byte-level tokenizer does not normalize, so the GGUF would tokenize text "
            "differently",
            hint="edgekit converts byte-level tokenizers without a normalizer, or with NFC",
        )
    signature = _signature(data.get("pre_tokenizer"))
    pre = pre_override or PRE_TOKENIZERS.get(signature)
    if pre is None:
        raise UnsupportedConversionError(
            f"{path}: unknown byte-level pre-tokenizer {clean_text(signature)}; llama.cpp "
            "would load the file and tokenize text wrongly",
            hint=f"pass the llama.cpp pre-tokenizer name (tokenizer_pre=...); known: "
            f"{', '.join(sorted(PRE_BY_NAME))}",
        )
    ignores = bool(model.get("ignore_merges"))
    if pre in PRE_BY_NAME and ignores != (pre in _IGNORES_MERGES):
        warnings.append(
            f"{path}: ignore_merges is {str(ignores).lower()} but llama.cpp's {pre!r} "
            f"pre-tokenizer {'does not ignore' if ignores else 'ignores'} merges: a word that "
            "is itself a token may tokenize differently"
        )
    return pre, warnings


# --- special tokens, BOS and EOS ---------------------------------------------------------


def _token_name(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _special_ids(
    config: dict[str, Any], model_config: dict[str, Any], index: dict[str, int], unk: Any
) -> dict[str, int]:
    """bos/eos/unk/pad ids as transformers resolves them: tokenizer_config.json's tokens
    first, then config.json's ids."""
    ids: dict[str, int] = {}
    for kind in ("bos", "eos", "pad", "unk"):
        name = _token_name(config.get(f"{kind}_token"))
        if kind == "unk" and name is None:
            name = _token_name(unk)
        if name is not None and name in index:
            ids[kind] = index[name]
            continue
        value = model_config.get(f"{kind}_token_id")
        if isinstance(value, list) and value:  # Llama 3.1 lists several EOS ids
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(index):
            ids[kind] = value
    return ids


def _template_specials(post: Any, path: Path) -> tuple[list[str], list[str]] | None:
    """The special tokens the tokenizer.json post-processor puts before and after a single
    sequence, or None when it adds none (no TemplateProcessing)."""
    if post is None:
        return None
    node = _as_dict(post, path, "post_processor")
    procs = node.get("processors") if node.get("type") == "Sequence" else [node]
    if not isinstance(procs, list):
        raise _bad(path, "post_processor Sequence has no processors list")
    for proc in procs:
        if not isinstance(proc, dict):
            raise _bad(path, "post_processor entry is not an object")
        kind = proc.get("type")
        if kind == "ByteLevel":
            continue  # offsets only
        if kind != "TemplateProcessing":
            raise UnsupportedConversionError(
                f"{path}: post-processor {clean_text(kind)!r}: llama.cpp adds at most a BOS "
                "and an EOS token",
                hint="edgekit converts tokenizers whose post-processor is a TemplateProcessing",
            )
        single = proc.get("single")
        if not isinstance(single, list):
            raise _bad(path, "TemplateProcessing has no single template")
        names = [
            (p.get("SpecialToken") or {}).get("id") if isinstance(p, dict) else None for p in single
        ]
        seq = [i for i, p in enumerate(single) if isinstance(p, dict) and "Sequence" in p]
        if len(seq) != 1 or not all(isinstance(n, str) for i, n in enumerate(names) if i != seq[0]):
            raise _bad(path, "TemplateProcessing's single template is not specials around $A")
        return [str(n) for n in names[: seq[0]]], [str(n) for n in names[seq[0] + 1 :]]
    return None


def _add_bos_eos(
    data: dict[str, Any], path: Path, ids: dict[str, int], tokens: list[str]
) -> tuple[bool, bool]:
    """Whether the tokenizer adds BOS and EOS: tokenizer.json's post-processor decides.
    (transformers 5 drops tokenizer_config.json's add_bos_token / add_eos_token when a
    tokenizer.json is present, and adds nothing when the post-processor is null.)"""
    specials = _template_specials(data.get("post_processor"), path)
    if specials is None:
        return False, False
    before, after = specials
    if len(before) > 1 or len(after) > 1:
        raise UnsupportedConversionError(
            f"{path}: the post-processor adds {clean_text(before)} before and "
            f"{clean_text(after)} after the text; llama.cpp adds at most one BOS and one EOS",
            hint="edgekit converts tokenizers that add at most a BOS and an EOS token",
        )
    index = {t: i for i, t in enumerate(tokens)}
    for kind, names in (("bos", before), ("eos", after)):
        if names:
            if names[0] not in index:
                raise _bad(path, f"the post-processor adds {clean_text(names[0])!r}, not a token")
            ids[kind] = index[names[0]]  # the token the text really starts / ends with
    return bool(before), bool(after)


def _chat_template(folder: Path, config: dict[str, Any]) -> str | list[dict[str, str]] | None:
    value = config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    ):
        return [{"name": t["name"], "template": t["template"]} for t in value]
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        if jinja.stat().st_size > MAX_CONFIG_BYTES:
            raise _bad(jinja, "larger than a chat template can be")
        return jinja.read_text(encoding="utf-8", errors="replace")
    path = folder / "chat_template.json"
    if path.is_file():
        template = _as_dict(_load_json(path, MAX_CONFIG_BYTES), path, "chat_template.json")
        if isinstance(template.get("chat_template"), str):
            return str(template["chat_template"])
    return None


def _rebuilt_by_transformers(
    config: dict[str, Any], model_config: dict[str, Any], folder: Path
) -> str | None:
    """transformers 5 loads a Llama folder whose tokenizer_config.json names LlamaTokenizer
    (real Llama 2 checkpoints) with its own Metaspace pipeline, not the tokenizer.json's.
    (For Mistral and Phi-3 it maps the model type to TokenizersBackend, which reads the
    tokenizer.json as it is.)"""
    name = str(config.get("tokenizer_class") or "").removesuffix("Fast")
    if name != "LlamaTokenizer" or model_config.get("model_type") != "llama":
        return None
    scheme = "always" if config.get("legacy") is True else "first"
    return (
        f"{folder}: transformers 5 loads this tokenizer as LlamaTokenizer with a Metaspace "
        f"pre-tokenizer (prepend_scheme {scheme!r}) instead of its tokenizer.json's pipeline; "
        "the GGUF tokenizes like the tokenizer.json, so transformers' ids differ from it "
        + ("after special tokens and " if scheme == "first" else "")
        + "for text that starts with a space"
    )


# --- lstrip / rstrip ---------------------------------------------------------------------


def phi3_rstrip_ids(tokens: Sequence[str], types: Sequence[int]) -> set[int] | None:
    """The ids llama.cpp strips whitespace after under its Phi-3 name rule, or None when the
    rule cannot apply (llama.cpp then fails to load the file: the rule looks these tokens
    up by text)."""
    index = {t: i for i, t in enumerate(tokens)}
    if not all(t in index for t in (*_PHI3_NOT_STRIPPED, *_PHI3_STRIPPED)):
        return None
    ids = {
        i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
    }
    ids |= {index[t] for t in _PHI3_STRIPPED}
    return ids - {index[t] for t in _PHI3_NOT_STRIPPED}


def _strip_flags(
    added: Sequence[AddedToken], tokens: list[str], types: list[int], path: Path
) -> tuple[bool, list[str]]:
    """Whether the tokenizer's strip flags are llama.cpp's Phi-3 rule (then the file must be
    named for it), and warnings for the flags llama.cpp ignores."""
    rstrip = {t.id for t in added if t.rstrip and t.id < len(tokens)}
    phi3 = phi3_rstrip_ids(tokens, types)
    uses_rule = bool(rstrip) and rstrip == phi3
    ignored = [
        t.content
        for t in added
        if t.id < len(tokens) and (t.lstrip or t.single_word or (t.rstrip and not uses_rule))
    ]
    warnings = []
    if ignored:
        shown = ", ".join(repr(clean_text(c, max_len=40)) for c in ignored[:5])
        warnings.append(
            f"{path}: llama.cpp ignores the lstrip/rstrip/single_word flags of {shown}"
            f"{f' and {len(ignored) - 5} more' if len(ignored) > 5 else ''}: whitespace next "
            "to these tokens tokenizes differently"
        )
    return uses_rule, warnings


def general_name(name: str, *, phi3_rstrip: bool) -> str:
    """``name`` as the GGUF's general.name: llama.cpp applies Phi-3's rstrip rule to every
    file whose name contains "phi3" or "phi-3", so the name says so exactly when the
    tokenizer needs the rule (a Phi-3 fine-tune in a folder of any name), and does not when
    it must not (a Llama named "...phi3..." fails to load or tokenizes wrongly otherwise)."""
    has = any(m in name.lower() for m in PHI3_NAME_MARKERS)
    if phi3_rstrip and not has:
        return f"{name} (phi3 tokenizer)"
    if not phi3_rstrip and has:
        return re.sub(r"(?i)phi(-?)3", lambda m: f"Phi{m.group(1)} 3", name)
    return name


# --- Hugging Face -> GGUF ----------------------------------------------------------------


def _token_table(
    vocab: dict[str, int], added: list[AddedToken], vocab_size: int, path: Path
) -> tuple[list[str | None], dict[int, AddedToken], list[str]]:
    """Id -> token for ids below ``vocab_size`` (the model's embedding rows), the added
    tokens by id, and warnings."""
    warnings = []
    if len(vocab) != len(set(vocab.values())):
        raise _bad(path, "two vocabulary tokens share an id")
    by_id: list[str | None] = [None] * vocab_size
    beyond = [t for t, i in vocab.items() if i >= vocab_size]
    if beyond:
        raise UnsupportedConversionError(
            f"{path}: {len(beyond)} vocabulary tokens have ids beyond the model's "
            f"{vocab_size} embedding rows (e.g. {clean_text(beyond[0])!r})",
            hint="the tokenizer does not belong to this model",
        )
    for tok, i in vocab.items():
        by_id[i] = tok
    added_by_id: dict[int, AddedToken] = {}
    dropped = []
    for t in added:
        if t.id >= vocab_size:
            dropped.append(t.content)
            continue
        if by_id[t.id] not in (None, t.content):
            raise _bad(
                path,
                f"id {t.id} is both {clean_text(by_id[t.id])!r} and the added token "
                f"{clean_text(t.content)!r}",
            )
        by_id[t.id] = t.content
        added_by_id[t.id] = t
    if dropped:
        warnings.append(
            f"{path}: {len(dropped)} added tokens have ids beyond the model's {vocab_size} "
            f"embedding rows and are left out (e.g. {clean_text(dropped[0])!r})"
        )
    # An added token whose text is also a vocabulary entry of another id shadows it in
    # Hugging Face; llama.cpp needs every text once, so the shadowed id becomes padding.
    seen: dict[str, int] = {}
    for i, text in enumerate(by_id):
        if text is None:
            continue
        if text in seen:
            keep = i if i in added_by_id else seen[text]
            drop = seen[text] if keep == i else i
            by_id[drop] = None
            seen[text] = keep
            warnings.append(
                f"{path}: {clean_text(text)!r} is both id {drop} and {keep}; id {drop} is "
                "unreachable in Hugging Face and is written as padding"
            )
        else:
            seen[text] = i
    return by_id, added_by_id, warnings


def _pad_name(i: int, taken: set[str]) -> str:
    name = f"[PAD{i}]"
    while name in taken:
        name = f"[{name}]"
    return name


def read_vocab(
    folder: Path,
    vocab_size: int,
    *,
    pre_override: str | None = None,
) -> GgufVocab:
    """The GGUF vocabulary of a Hugging Face tokenizer, ``vocab_size`` tokens long.

    Raises:
        UnsupportedConversionError: no tokenizer.json, a tokenizer model other than BPE, a
            pipeline llama.cpp cannot express, or an unknown byte-level pre-tokenizer
            (pass ``pre_override``).
        ModelFormatError: a tokenizer file that is not what its format says.
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedConversionError(
            f"{folder}: no tokenizer.json",
            hint="save the tokenizer with transformers (tokenizer.save_pretrained) first",
        )
    data = _as_dict(_load_json(path, MAX_TOKENIZER_BYTES), path, "tokenizer.json")
    config_path = folder / "tokenizer_config.json"
    config = (
        _as_dict(_load_json(config_path, MAX_CONFIG_BYTES), config_path, "tokenizer_config.json")
        if config_path.is_file()
        else {}
    )
    model_config_path = folder / "config.json"
    model_config = (
        _as_dict(_load_json(model_config_path, MAX_CONFIG_BYTES), model_config_path, "config.json")
        if model_config_path.is_file()
        else {}
    )
    model = _as_dict(data.get("model"), path, "model")
    if model.get("type") != "BPE":
        raise UnsupportedConversionError(
            f"{path}: tokenizer model {clean_text(model.get('type'))!r} is not supported",
            hint="edgekit converts BPE tokenizers (byte-level or SentencePiece-style)",
        )
    sentencepiece = bool(model.get("byte_fallback"))
    merges = _merges(model, path)
    added = _added(data, path)
    by_id, added_by_id, warnings = _token_table(_vocab(model, path), added, vocab_size, path)

    unk = model.get("unk_token")
    taken = {t for t in by_id if t is not None}
    tokens: list[str] = []
    types: list[int] = []
    for i, tok in enumerate(by_id):
        if tok is None:
            tok = _pad_name(i, taken)
            kind = TOKEN_UNUSED
        elif i in added_by_id:
            if tok == unk:
                kind = TOKEN_UNKNOWN
            else:
                kind = TOKEN_CONTROL if added_by_id[i].special else TOKEN_USER_DEFINED
        elif sentencepiece and _BYTE_TOKEN.fullmatch(tok):
            kind = TOKEN_BYTE
        else:
            kind = TOKEN_NORMAL
        tokens.append(tok)
        types.append(kind)

    index = {t: i for i, t in enumerate(tokens)}
    special_ids = _special_ids(config, model_config, index, unk)
    add_bos, add_eos = _add_bos_eos(data, path, special_ids, tokens)
    phi3_rstrip, strip_warnings = _strip_flags(added, tokens, types, path)
    warnings += strip_warnings

    common: dict[str, Any] = {
        "tokens": tokens,
        "types": types,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "special_ids": special_ids,
        "chat_template": _chat_template(folder, config),
        "phi3_rstrip": phi3_rstrip,
    }
    if sentencepiece:
        missing = [b for b in range(256) if f"<0x{b:02X}>" not in index]
        if missing:
            raise UnsupportedConversionError(
                f"{path}: byte fallback without the byte token <0x{missing[0]:02X}> "
                f"({len(missing)} of 256 missing): llama.cpp's SentencePiece tokenizer needs "
                "all 256",
                hint="the tokenizer.json is incomplete; save it again with transformers",
            )
        prefix = _spm_prefix(data, path)
        if prefix.caveat:
            warnings.append(prefix.caveat)
        rebuilt = _rebuilt_by_transformers(config, model_config, folder)
        if rebuilt:
            warnings.append(rebuilt)
        unmerged = _unmerged_pieces(tokens, types, merges)
        if unmerged:
            warnings.append(
                f"{path}: {len(unmerged)} pieces (e.g. "
                f"{', '.join(repr(clean_text(u, max_len=20)) for u in unmerged[:3])}) can be "
                "joined by llama.cpp from two pieces that the tokenizer's merges never join: "
                "text containing them may tokenize differently"
            )
        return GgufVocab(
            model="llama",
            pre=None,
            scores=spm_scores(tokens, types, merges),
            merges=[],
            add_space_prefix=prefix.add,
            warnings=tuple(warnings),
            **common,
        )
    pre, pre_warnings = _byte_level(data, model, path, pre_override)
    warnings += pre_warnings
    spaced = next((m for m in merges if " " in m[0] or " " in m[1]), None)
    if spaced is not None:
        # GGUF stores a merge as "left right": a space inside a token cannot be written.
        raise UnsupportedConversionError(
            f"{path}: the merge {clean_text(spaced)} has a space inside a token, which a "
            "GGUF merge list cannot hold",
            hint="byte-level tokenizers write spaces as 'Ġ'; this tokenizer is not one",
        )
    return GgufVocab(
        model="gpt2",
        pre=pre,
        scores=None,
        merges=[f"{left} {right}" for left, right in merges],
        add_space_prefix=None,
        warnings=tuple(warnings),
        **common,
    )


def write_vocab(writer: gguf.GGUFWriter, vocab: GgufVocab) -> None:
    """Write every ``tokenizer.*`` key of ``vocab``, the ones llama.cpp has defaults for
    included (its defaults are not the Hugging Face tokenizer's)."""
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    handlers = {
        "bos": writer.add_bos_token_id,
        "eos": writer.add_eos_token_id,
        "unk": writer.add_unk_token_id,
        "pad": writer.add_pad_token_id,
    }
    for kind, token_id in vocab.special_ids.items():
        handlers[kind](token_id)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


# --- GGUF -> Hugging Face ----------------------------------------------------------------


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
    return model == "llama" or pre in _ADDS_BOS_BY_DEFAULT


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

    def flag(key: str, default: bool) -> bool:
        value = header.get(f"tokenizer.ggml.{key}")
        return value if isinstance(value, bool) else default

    add_bos = flag("add_bos_token", llamacpp_add_bos_default(model, pre))
    add_eos = flag("add_eos_token", False)

    defaults = {"bos": 1, "eos": 2, "unk": 0} if model == "llama" else {}

    def token(kind: str, key: str) -> str | None:
        value = header.get(f"tokenizer.ggml.{key}", defaults.get(kind))
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
            return str(tokens[value])
        return None

    bos, eos = token("bos", "bos_token_id"), token("eos", "eos_token_id")
    unk, pad = token("unk", "unknown_token_id"), token("pad", "padding_token_id")
    name = header.get("general.name")
    stripped: set[int] = set()
    if isinstance(name, str) and any(m in name.lower() for m in PHI3_NAME_MARKERS):
        stripped = phi3_rstrip_ids(tokens, types) or set()
    added = [
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
    post_processor = _post_processor(tokens, bos if add_bos else None, eos if add_eos else None)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if model == "llama":
        scores = _header_list(header, "tokenizer.ggml.scores", float, len(tokens))
        if scores is None:
            raise ModelFormatError(f"{header.path}: a SentencePiece GGUF without token scores")
        prefix = flag("add_space_prefix", True)
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE}
        decoders: list[dict[str, Any]] = [
            {"type": "Replace", "pattern": {"String": SPIECE}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]
        if prefix:
            decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        tokenizer: dict[str, Any] = {
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
                "vocab": vocab,
                "merges": sentencepiece_merges(tokens, types, scores),
            },
        }
    else:
        pre = pre or "gpt-2"
        merges = _header_list(header, "tokenizer.ggml.merges", str, None) or []
        tokenizer = {
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
                "ignore_merges": pre in _IGNORES_MERGES,
                "vocab": vocab,
                "merges": merges,
            },
        }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        **tokenizer,
        "post_processor": post_processor,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": pad,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(
            header.get(f"{header.get('general.architecture')}.context_length", 4096)
        ),
    }
    return tokenizer, config


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
