"""Reading untrusted documents and showing untrusted names.

Every JSON document edgekit reads (config.json, shard indexes, safetensors headers,
manifests, tokenizer files, calibration caches, HTTP request bodies) comes from a file or
a client it does not control. ``parse_json`` is the one way in: it bounds the size before
parsing, the nesting depth (Python's parser recurses, and a ``[[[[...`` of a few kilobytes
must not reach the rest of the program), rejects repeated keys (two readers of the
same file must not see different values) and the non-standard constants ``NaN`` and
``Infinity``. ``check_depth`` bounds an already parsed document (a TOML table).

``clean_text`` makes a name read from a file safe to show on a terminal or in a log: it
removes control characters (terminal escape sequences start with one) and the Unicode
bidirectional overrides that reorder what a reader sees.
"""

from __future__ import annotations

import json
import re
from typing import Any

from edgekit.errors import EdgekitError, SchemaError

#: Deeper than any real config, tokenizer or manifest (tokenizer.json nests about 6 deep).
DEFAULT_MAX_DEPTH = 64

# C0 and C1 control characters (ESC, BEL, CR, backspace...), DEL, and the bidi controls
# (U+202A-U+202E, U+2066-U+2069) and zero-width marks that change how text reads.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def clean_text(text: object, *, max_len: int = 200) -> str:
    """``text`` as a single printable line: control characters become ``?``, surrogates
    that cannot be encoded are replaced, and more than ``max_len`` characters are cut
    with an ellipsis."""
    s = str(text)
    s = s.encode("utf-8", "replace").decode("utf-8")
    s = _UNSAFE.sub("?", s)
    if len(s) > max_len:
        s = s[: max_len - 1] + "…"
    return s


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice in one object")
            seen.add(key)
    return out


def parse_json(
    data: str | bytes,
    *,
    where: str,
    max_bytes: int,
    max_depth: int | None = DEFAULT_MAX_DEPTH,
    error: type[EdgekitError] = SchemaError,
    hint: str | None = None,
) -> Any:
    """Parse an untrusted JSON document.

    ``max_depth=None`` skips the depth walk (a second pass over the document) for large
    files whose readers only look up known keys, such as tokenizer.json: the C parser
    still refuses nesting deep enough to exhaust the stack.

    Raises:
        error (SchemaError by default): larger than ``max_bytes``, not UTF-8, not JSON,
            nested deeper than ``max_depth``, a repeated key, or NaN/Infinity.
    """
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > max_bytes:
        raise error(
            f"{where}: {size:,} bytes is larger than the {max_bytes:,} bytes allowed",
            hint=hint,
        )
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(
            text, parse_constant=_reject_constant, object_pairs_hook=_no_repeated_keys
        )
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason})", hint=hint) from exc
    except RecursionError as exc:
        # The C parser guards its own recursion: very deep nesting ends up here.
        raise error(f"{where}: nested too deeply to read", hint=hint) from exc
    except ValueError as exc:
        raise error(f"{where}: not valid JSON ({exc})", hint=hint) from exc
    if max_depth is not None:
        check_depth(value, where=where, max_depth=max_depth, error=error)
    return value


def check_depth(
    value: Any,
    *,
    where: str,
    max_depth: int = DEFAULT_MAX_DEPTH,
    error: type[EdgekitError] = SchemaError,
) -> None:
    """Raise ``error`` when a parsed document (dicts and lists) nests deeper than
    ``max_depth``. Iterative, so it cannot itself overflow the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > max_depth:
                raise error(f"{where}: nested deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend(
                (child, depth + 1) for child in children if isinstance(child, dict | list)
            )
