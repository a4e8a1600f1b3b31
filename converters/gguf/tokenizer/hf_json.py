"""Reading a Hugging Face tokenizer's JSON files, which are untrusted input: capped in
size, each field checked for the type it must have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.converters.gguf.tokenizer.vocab import AddedToken

from edgekit.errors import ModelFormatError
from edgekit.untrusted import clean_text, parse_json


def load_json(path: Path, max_bytes: int) -> Any:
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


def bad_file(path: Path, what: str) -> ModelFormatError:
    return ModelFormatError(
        f"{path}: {what}", hint="save the tokenizer again with transformers (save_pretrained)"
    )


def as_dict(value: Any, path: Path, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_file(path, f"{what} is not an object")
    return value


def vocab_of(model: dict[str, Any], path: Path) -> dict[str, int]:
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise bad_file(path, "model.vocab is not an object of token -> id")
    for token, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise bad_file(path, f"token {clean_text(token)!r} has the id {clean_text(i)!r}")
    return vocab


def merges_of(model: dict[str, Any], path: Path) -> list[tuple[str, str]]:
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        raise bad_file(path, "model.merges is not a list")
    out: list[tuple[str, str]] = []
    for m in merges:
        pair = m.split(" ") if isinstance(m, str) else m
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(p, str) and p for p in pair)
        ):
            raise bad_file(path, f"merge {clean_text(m)!r} is not two tokens")
        out.append((pair[0], pair[1]))
    return out


def added_tokens(data: dict[str, Any], path: Path) -> list[AddedToken]:
    items = data.get("added_tokens") or []
    if not isinstance(items, list):
        raise bad_file(path, "added_tokens is not a list")
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
            raise bad_file(path, f"added token {clean_text(t)!r} needs an id and a content")
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


def steps(component: Any, key: str, path: Path, what: str) -> list[dict[str, Any]]:
    """A normalizer or pre-tokenizer as a flat list of steps (Sequences unrolled)."""
    if component is None:
        return []
    node = as_dict(component, path, what)
    if node.get("type") == "Sequence":
        parts = node.get(key)
        if not isinstance(parts, list):
            raise bad_file(path, f"{what} Sequence has no {key} list")
        return [s for p in parts for s in steps(p, key, path, what)]
    return [node]


def pattern_of(step: dict[str, Any]) -> Any:
    pattern = step.get("pattern")
    if isinstance(pattern, dict):
        return pattern.get("String", pattern.get("Regex"))
    return None


def describe(step: dict[str, Any]) -> str:
    kind = step.get("type")
    pattern = pattern_of(step)
    return clean_text(f"{kind}({pattern!r})" if pattern is not None else f"{kind}")

