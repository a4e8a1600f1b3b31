"""Hugging Face tokenizer -> GGUF ``tokenizer.*`` metadata (``read_vocab``, then
``write_vocab`` into the file being written)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.converters.gguf.tokenizer.byte_level import byte_level_pre
from edgekit.converters.gguf.tokenizer.hf_json import (
    added_tokens,
    as_dict,
    bad_file,
    load_json,
    merges_of,
    vocab_of,
)
from edgekit.converters.gguf.tokenizer.specials import (
    add_bos_eos,
    read_chat_template,
    rebuilt_by_transformers,
    resolve_special_ids,
    strip_flags,
)
from edgekit.converters.gguf.tokenizer.spm import spm_prefix, spm_scores, unmerged_pieces
from edgekit.converters.gguf.tokenizer.vocab import (
    BYTE_TOKEN,
    MAX_CONFIG_BYTES,
    MAX_TOKENIZER_BYTES,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    AddedToken,
    GgufVocab,
)

from edgekit.errors import UnsupportedConversionError
from edgekit.untrusted import clean_text

if TYPE_CHECKING:
    import gguf


def _token_table(
    vocab: dict[str, int], added: list[AddedToken], vocab_size: int, path: Path
) -> tuple[list[str | None], dict[int, AddedToken], list[str]]:
    """Id -> token for ids below ``vocab_size`` (the model's embedding rows), the added
    tokens by id, and warnings."""
    warnings = []
    if len(vocab) != len(set(vocab.values())):
        raise bad_file(path, "two vocabulary tokens share an id")
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
            raise bad_file(
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
    files = _read_files(folder)
    path, data = files.path, files.data
    model = as_dict(data.get("model"), path, "model")
    if model.get("type") != "BPE":
        raise UnsupportedConversionError(
            f"{path}: tokenizer model {clean_text(model.get('type'))!r} is not supported",
            hint="edgekit converts BPE tokenizers (byte-level or SentencePiece-style)",
        )
    sentencepiece = bool(model.get("byte_fallback"))
    merges = merges_of(model, path)
    added = added_tokens(data, path)
    by_id, added_by_id, warnings = _token_table(vocab_of(model, path), added, vocab_size, path)
    unk = model.get("unk_token")
    tokens, types = _typed_tokens(by_id, added_by_id, unk, sentencepiece=sentencepiece)

    index = {t: i for i, t in enumerate(tokens)}
    special_ids = resolve_special_ids(files.config, files.model_config, index, unk)
    add_bos, add_eos = add_bos_eos(data, path, special_ids, tokens)
    phi3_rstrip, strip_warnings = strip_flags(added, tokens, types, path)
    warnings += strip_warnings

    common: dict[str, Any] = {
        "tokens": tokens,
        "types": types,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "special_ids": special_ids,
        "chat_template": read_chat_template(folder, files.config),
        "phi3_rstrip": phi3_rstrip,
    }
    if sentencepiece:
        return _sentencepiece_vocab(files, merges, warnings, common)
    return _byte_level_vocab(files, model, pre_override, merges, warnings, common)


@dataclass(frozen=True, kw_only=True)
class _TokenizerFiles:
    folder: Path
    path: Path  # tokenizer.json
    data: dict[str, Any]  # tokenizer.json
    config: dict[str, Any]  # tokenizer_config.json ({} when there is none)
    model_config: dict[str, Any]  # config.json ({} when there is none)


def _read_files(folder: Path) -> _TokenizerFiles:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedConversionError(
            f"{folder}: no tokenizer.json",
            hint="save the tokenizer with transformers (tokenizer.save_pretrained) first",
        )
    data = as_dict(load_json(path, MAX_TOKENIZER_BYTES), path, "tokenizer.json")

    def optional(name: str) -> dict[str, Any]:
        file = folder / name
        if not file.is_file():
            return {}
        return as_dict(load_json(file, MAX_CONFIG_BYTES), file, name)

    return _TokenizerFiles(
        folder=folder,
        path=path,
        data=data,
        config=optional("tokenizer_config.json"),
        model_config=optional("config.json"),
    )


def _typed_tokens(
    by_id: list[str | None],
    added_by_id: dict[int, AddedToken],
    unk: Any,
    *,
    sentencepiece: bool,
) -> tuple[list[str], list[int]]:
    """Every id's token text (padding named for empty ids) and llama.cpp token type."""
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
        elif sentencepiece and BYTE_TOKEN.fullmatch(tok):
            kind = TOKEN_BYTE
        else:
            kind = TOKEN_NORMAL
        tokens.append(tok)
        types.append(kind)
    return tokens, types


def _sentencepiece_vocab(
    files: _TokenizerFiles,
    merges: list[tuple[str, str]],
    warnings: list[str],
    common: dict[str, Any],
) -> GgufVocab:
    path, tokens, types = files.path, common["tokens"], common["types"]
    index = set(tokens)
    missing = [b for b in range(256) if f"<0x{b:02X}>" not in index]
    if missing:
        raise UnsupportedConversionError(
            f"{path}: byte fallback without the byte token <0x{missing[0]:02X}> "
            f"({len(missing)} of 256 missing): llama.cpp's SentencePiece tokenizer needs "
            "all 256",
            hint="the tokenizer.json is incomplete; save it again with transformers",
        )
    prefix = spm_prefix(files.data, path)
    if prefix.caveat:
        warnings.append(prefix.caveat)
    rebuilt = rebuilt_by_transformers(files.config, files.model_config, files.folder)
    if rebuilt:
        warnings.append(rebuilt)
    unmerged = unmerged_pieces(tokens, types, merges)
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


def _byte_level_vocab(
    files: _TokenizerFiles,
    model: dict[str, Any],
    pre_override: str | None,
    merges: list[tuple[str, str]],
    warnings: list[str],
    common: dict[str, Any],
) -> GgufVocab:
    path = files.path
    pre, pre_warnings = byte_level_pre(files.data, model, path, pre_override)
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

