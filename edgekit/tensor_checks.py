"""The one check that a model file's tensors agree with its config: no duplicates, layers
exactly 0..n-1, and every tensor of the family's layout with the shape the config implies
(``edgekit.architectures`` says what that layout is).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from edgekit.architectures import GGUF_HINT, Dimensions, Family, gguf_layer_shapes, hf_shapes
from edgekit.errors import ModelFormatError
from edgekit.modelspec import TensorInfo, shown

_LAYER = re.compile(r"layers\.([^.]*)\.")
_BLOCK = re.compile(r"blk\.([^.]*)\.")


def _layer_index(index: str, layers: int) -> int | None:
    """A canonical decimal index below ``layers``, else None."""
    if not index.isdigit() or index != str(int(index)) or int(index) >= layers:
        return None
    return int(index)


def _listed(names: Iterable[str], n: int = 4) -> str:
    items = list(names)
    text = ", ".join(shown(x, 90)[1:-1] for x in items[:n])
    return text + (f" and {len(items) - n} more" if len(items) > n else "")


def _check_layers(
    tensors: tuple[TensorInfo, ...],
    *,
    prefix: str,
    pattern: re.Pattern[str],
    word: str,
    layers: int,
    where: str,
    count_key: str,
    hint: str,
) -> None:
    """Every tensor under ``prefix`` + layers/blk must be in a layer below ``layers``,
    and every layer must hold at least one tensor."""
    seen: set[int] = set()
    for t in tensors:
        if not t.name.startswith(prefix):
            continue
        m = pattern.match(t.name, len(prefix))
        if m is None:
            continue
        index = _layer_index(m.group(1), layers)
        if index is None:
            raise ModelFormatError(
                f"{where}: tensor {shown(t.name, 90)} is in a layer the model does not have "
                f"({count_key} = {layers}: layers 0 to {layers - 1})",
                hint=hint,
            )
        seen.add(index)
    missing = [i for i in range(layers) if i not in seen]
    if missing:
        raise ModelFormatError(
            f"{where}: {count_key} = {layers}, but no tensor is in layer "
            f"{', '.join(f'{prefix}{word}.{i}' for i in missing[:4])}"
            + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""),
            hint=hint,
        )


def _check_shapes(
    tensors: tuple[TensorInfo, ...], expected: dict[str, tuple[int, ...]], where: str, hint: str
) -> None:
    for t in tensors:
        want = expected.get(t.name)
        if want is not None and t.shape != want:
            raise ModelFormatError(
                f"{where}: tensor {shown(t.name, 90)} has shape {list(t.shape)}, but the "
                f"model's dimensions make it {list(want)}",
                hint=hint,
            )


def _check_unique(tensors: tuple[TensorInfo, ...], where: str, hint: str) -> None:
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise ModelFormatError(f"{where}: tensor {shown(t.name, 90)} appears twice", hint=hint)
        seen.add(t.name)


def _hf_prefix(names: set[str], where: str) -> str:
    """Where the language model's tensors live: ``model.`` for a text checkpoint;
    ``language_model.model.`` or ``model.language_model.`` beside a vision tower."""
    if "model.embed_tokens.weight" in names:
        return "model."
    found = sorted(
        n[: -len("embed_tokens.weight")] for n in names if n.endswith(".embed_tokens.weight")
    )
    if len(found) == 1:
        return found[0]
    raise ModelFormatError(
        f"{where}: "
        + (
            "no token embedding (model.embed_tokens.weight) among the tensors"
            if not found
            else f"several token embeddings ({_listed(found)}embed_tokens.weight)"
        ),
        hint="the weights are incomplete or not a causal language model's",
    )


def check_hf_tensors(
    family: Family,
    dims: Dimensions,
    tensors: tuple[TensorInfo, ...],
    *,
    where: str,
    quantized: bool = False,
    embedding_columns: int | None = None,
) -> None:
    """The tensors of a Hugging Face checkpoint must match its config: one embedding,
    layers 0..num_hidden_layers-1 and no others, every tensor of the family's layout
    with the shape the config implies (a pre-quantized checkpoint stores its projections
    in other tensors: only its layers and embedding are checked). Tensors outside the
    language model's layers (a vision tower, an adapter) are left to the converters.
    ``embedding_columns``: the columns a packed embedding is stored in (mlx-lm's
    group-wise packing: hidden x bits / 32), checked instead of the hidden size.

    Raises:
        ModelFormatError: a duplicate, a missing or extra layer, a missing tensor, or a
            shape that disagrees with the config.
    """
    hint = "the weights do not belong to this config.json, or a shard is corrupt"
    _check_unique(tensors, where, hint)
    names = {t.name for t in tensors}
    prefix = _hf_prefix(names, where)
    _check_layers(
        tensors,
        prefix=prefix,
        pattern=_LAYER,
        word="layers",
        layers=dims.layers,
        where=where,
        count_key="num_hidden_layers",
        hint=hint,
    )
    embedding = prefix + "embed_tokens.weight"
    if quantized:
        columns = dims.hidden_size if embedding_columns is None else embedding_columns
        _check_shapes(tensors, {embedding: (dims.vocab_size, columns)}, where, hint)
        return
    expected = {
        (prefix + n[len("model.") :] if n.startswith("model.") else n): s
        for n, s in hf_shapes(family, dims)
    }
    # A tied checkpoint may still store the output projection: it must fit, if present.
    optional = {"lm_head.weight": (dims.vocab_size, dims.hidden_size)}
    _check_shapes(tensors, {**optional, **expected}, where, hint)
    missing = [n for n in expected if n not in names]
    if missing:
        raise ModelFormatError(f"{where}: missing tensors: {_listed(missing)}", hint=hint)


def check_gguf_tensors(
    family: Family,
    dims: Dimensions,
    tensors: tuple[TensorInfo, ...],
    *,
    where: str,
    kv_known: bool = True,
) -> None:
    """The tensors of a GGUF file must match its metadata: token_embd, blocks
    0..block_count-1 and no others, and every tensor llama.cpp names with the shape the
    metadata implies.

    Raises:
        ModelFormatError: a duplicate, no token embedding, a missing or extra block, or a
            shape that disagrees with the metadata.
    """
    hint = GGUF_HINT
    _check_unique(tensors, where, hint)
    if not any(t.name == "token_embd.weight" for t in tensors):
        raise ModelFormatError(f"{where}: no token_embd.weight among the tensors", hint=hint)
    _check_layers(
        tensors,
        prefix="",
        pattern=_BLOCK,
        word="blk",
        layers=dims.layers,
        where=where,
        count_key="block_count",
        hint=hint,
    )
    per_block = gguf_layer_shapes(family, dims, kv_known=kv_known)
    expected = {
        "token_embd.weight": (dims.vocab_size, dims.hidden_size),
        "output.weight": (dims.vocab_size, dims.hidden_size),
        "output_norm.weight": (dims.hidden_size,),
    }
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m is not None and t.name[m.end() :] in per_block:
            expected[t.name] = per_block[t.name[m.end() :]]
    _check_shapes(tensors, expected, where, hint)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
