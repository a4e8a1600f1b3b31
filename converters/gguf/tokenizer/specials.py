"""Special tokens, BOS and EOS, the chat template, and the lstrip/rstrip flags llama.cpp
honours only through its Phi-3 name rule."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgekit.converters.gguf.tokenizer.hf_json import as_dict, bad_file, load_json
from edgekit.converters.gguf.tokenizer.vocab import (
    MAX_CONFIG_BYTES,
    PHI3_NAME_MARKERS,
    TOKEN_CONTROL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    AddedToken,
)

from edgekit.errors import UnsupportedConversionError
from edgekit.untrusted import clean_text

# The tokens llama.cpp's Phi-3 rule looks up by text: never stripped, and stripped.
_PHI3_NOT_STRIPPED = ("<unk>", "<s>", "<|endoftext|>")
_PHI3_STRIPPED = ("</s>",)


def _token_name(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def resolve_special_ids(
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
    node = as_dict(post, path, "post_processor")
    procs = node.get("processors") if node.get("type") == "Sequence" else [node]
    if not isinstance(procs, list):
        raise bad_file(path, "post_processor Sequence has no processors list")
    for proc in procs:
        if not isinstance(proc, dict):
            raise bad_file(path, "post_processor entry is not an object")
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
            raise bad_file(path, "TemplateProcessing has no single template")
        names = [
            (p.get("SpecialToken") or {}).get("id") if isinstance(p, dict) else None for p in single
        ]
        seq = [i for i, p in enumerate(single) if isinstance(p, dict) and "Sequence" in p]
        if len(seq) != 1 or not all(isinstance(n, str) for i, n in enumerate(names) if i != seq[0]):
            raise bad_file(path, "TemplateProcessing's single template is not specials around $A")
        return [str(n) for n in names[: seq[0]]], [str(n) for n in names[seq[0] + 1 :]]
    return None


def add_bos_eos(
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
                raise bad_file(
                    path, f"the post-processor adds {clean_text(names[0])!r}, not a token"
                )
            ids[kind] = index[names[0]]  # the token the text really starts / ends with
    return bool(before), bool(after)


def read_chat_template(folder: Path, config: dict[str, Any]) -> str | list[dict[str, str]] | None:
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
            raise bad_file(jinja, "larger than a chat template can be")
        return jinja.read_text(encoding="utf-8", errors="replace")
    path = folder / "chat_template.json"
    if path.is_file():
        template = as_dict(load_json(path, MAX_CONFIG_BYTES), path, "chat_template.json")
        if isinstance(template.get("chat_template"), str):
            return str(template["chat_template"])
    return None


def rebuilt_by_transformers(
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


def strip_flags(
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

