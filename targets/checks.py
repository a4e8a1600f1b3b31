"""Checks on every value a caller hands a Target or a Session, before any runtime sees it.

llama.cpp and OpenVINO trust their arguments: a thread count of 100000 or a token id of -1
aborts the process, a negative thread count or a NaN temperature runs with a silently
different meaning. Each check here takes the untrusted value and either returns it in
its canonical form (a plain ``int``, ``float``, ``str``, ``list``) or raises SettingError
naming the setting, the value and the valid range. The targets (load settings) and the
Session base class (calls) go through these and nothing else.
"""

from __future__ import annotations

import difflib
import math
import operator
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

from edgekit.errors import SettingError

# llama.cpp reads 2**32 - 1 as "draw a random seed", so the largest usable seed is one less.
MAX_SEED = 2**32 - 2
MAX_TEMPERATURE = 10.0
MAX_REPEAT_PENALTY = 10.0
MAX_STOPS = 64
MAX_STOP_CHARS = 1024
# ggml's GGML_MAX_N_THREADS; above it llama.cpp writes past its thread arrays.
GGML_MAX_THREADS = 512
MAX_MESSAGE_DEPTH = 16  # a message's extra fields (tool calls, ...) nest a few levels
MAX_TOKEN_IDS = 1 << 24  # more ids than any context holds

_SURROGATE = re.compile("[\ud800-\udfff]")


def max_threads() -> int:
    """The most threads a session may ask for here: four per logical CPU (more only makes
    the runtime's threads wait for each other), at least 4, at most ggml's limit."""
    return min(GGML_MAX_THREADS, max(4, 4 * (os.cpu_count() or 1)))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def integer(name: str, value: Any, *, low: int, high: int | None = None, note: str = "") -> int:
    """``value`` as an int within [low, high]; bools and floats are refused, not rounded."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise SettingError(
            f"{name} must be an integer, not {type(value).__name__} {_show(value)}",
            hint=_range_text(low, high, note),
        )
    number = operator.index(value)
    if number < low or (high is not None and number > high):
        raise SettingError(
            f"{name} {number} is out of range: valid values are {_range_text(low, high, note)}",
            hint=f"pass {name} as an integer {_range_text(low, high, note)}",
        )
    return number


def _range_text(low: int, high: int | None, note: str) -> str:
    text = f"{low} or more" if high is None else f"{low} to {high}"
    return f"{text} ({note})" if note else text


def number(name: str, value: Any, *, low: float, high: float, low_open: bool = False) -> float:
    """``value`` as a finite float within [low, high] (or (low, high] when ``low_open``)."""
    valid = f"above {low:g} and at most {high:g}" if low_open else f"{low:g} to {high:g}"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        and not hasattr(value, "__float__")
    ):
        raise SettingError(
            f"{name} must be a number, not {type(value).__name__} {_show(value)}",
            hint=f"valid values are {valid}",
        )
    x = float(value)
    too_low = x <= low if low_open else x < low
    if not math.isfinite(x) or too_low or x > high:
        raise SettingError(
            f"{name} {x:g} is out of range: valid values are {valid}",
            hint=f"pass {name} {valid}",
        )
    return x


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SettingError(
            f"{name} must be true or false, not {type(value).__name__} {_show(value)}",
            hint=f"pass {name}=True or {name}=False",
        )
    return value


def choice(name: str, value: Any, options: Sequence[str], *, fold: str = "lower") -> str:
    """``value`` as one of ``options``, compared case-insensitively."""
    listed = ", ".join(options)
    if not isinstance(value, str):
        raise SettingError(
            f"{name} must be a string: one of {listed}, not {type(value).__name__} {_show(value)}",
            hint=f"use one of {listed}",
        )
    folded = value.lower() if fold == "lower" else value.upper()
    if folded not in options:
        raise SettingError(
            f"{name} {_show(value)} is not one of {listed}", hint=f"use one of {listed}"
        )
    return folded


def known_settings(given: Iterable[str], valid: Sequence[str], *, what: str) -> None:
    """Refuse a setting name that is not one of ``valid`` (a typo would be ignored or reach
    the runtime as a TypeError), suggesting the closest valid one."""
    for name in given:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise SettingError(
                f"unknown {what} {name!r}{guess}; valid: {', '.join(sorted(valid))}",
                hint=f"use only the {what}s listed",
            )


def text(name: str, value: Any, *, allow_empty: bool = True) -> str:
    """A str that can be encoded as UTF-8 (no lone surrogates, which the runtimes cannot
    take: llama.cpp's binding raises UnicodeEncodeError, OpenVINO's a TypeError)."""
    if not isinstance(value, str):
        raise SettingError(
            f"{name} must be a str, not {type(value).__name__} {_show(value)}",
            hint="pass text as a Python str",
        )
    if not allow_empty and not value:
        raise SettingError(f"{name} is empty", hint=f"pass a non-empty {name}")
    bad = _SURROGATE.search(value)
    if bad:
        raise SettingError(
            f"{name} contains a lone surrogate (U+{ord(bad.group()):04X}) at index "
            f"{bad.start()}: it is not valid Unicode text",
            hint="decode the text with errors='replace' (or fix how it was read)",
        )
    return value


def prompt(value: Any) -> str:
    if isinstance(value, str) and not value:
        raise SettingError(
            "the prompt is empty", hint="pass some text to continue from (a word is enough)"
        )
    return text("the prompt", value)


def token_ids(
    value: Any, *, vocab_size: int | None, name: str = "token ids", allow_empty: bool = True
) -> list[int]:
    """``value`` as a list of ints, each a valid id of the model's vocabulary."""
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise SettingError(
            f"{name} must be a list of integers, not {type(value).__name__}",
            hint="pass the ids tokenize() returned",
        )
    if isinstance(value, Sized) and len(value) > MAX_TOKEN_IDS:
        raise SettingError(
            f"{name}: {len(value):,} ids is more than the {MAX_TOKEN_IDS:,} allowed",
            hint="pass fewer tokens",
        )
    ids: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            raise SettingError(
                f"{name} must be integers; position {i} holds {type(item).__name__} {_show(item)}",
                hint="pass the ids tokenize() returned",
            )
        token = operator.index(item)
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            valid = f"0 to {vocab_size - 1}" if vocab_size is not None else "0 or more"
            raise SettingError(
                f"token id {token} at position {i} is out of range: this model's ids are {valid}",
                hint="pass the ids tokenize() returned for this model",
            )
        ids.append(token)
    if not ids and not allow_empty:
        raise SettingError(f"{name}: the prompt is empty (no tokens)", hint="pass some tokens")
    return ids


def stop_strings(value: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of strings: a single string, or a list or tuple of them."""
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        kind = (
            type(value).__name__
            if not isinstance(value, list | tuple)
            else next(type(s).__name__ for s in value if not isinstance(s, str))
        )
        raise SettingError(
            f"stop must be a string or a list of strings, not {kind}",
            hint='pass stop="\\n" or stop=["\\n", "User:"]',
        )
    if len(value) > MAX_STOPS:
        raise SettingError(
            f"stop has {len(value)} strings; at most {MAX_STOPS} are allowed",
            hint="pass fewer stop strings",
        )
    for i, s in enumerate(value):
        if len(s) > MAX_STOP_CHARS:
            raise SettingError(
                f"stop string {i} has {len(s)} characters; at most {MAX_STOP_CHARS} are allowed",
                hint="pass shorter stop strings",
            )
        text(f"stop string {i}", s)
    return tuple(value)


def messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages: a non-empty list of objects, each with a string ``role`` and a
    string ``content``; every string in them valid Unicode; extra fields (tool calls, a
    name) nested at most MAX_MESSAGE_DEPTH levels."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise SettingError(
            "messages must be a list of {'role': ..., 'content': ...} objects, not "
            f"{type(value).__name__}",
            hint='pass [{"role": "user", "content": "Hello"}]',
        )
    if not value:
        raise SettingError("messages is empty", hint="pass at least one message")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"message {i}"
        if not isinstance(message, Mapping):
            raise SettingError(
                f"{where} must be an object with 'role' and 'content', not "
                f"{type(message).__name__}",
                hint='pass {"role": "user", "content": "Hello"}',
            )
        for key in ("role", "content"):
            if key not in message:
                raise SettingError(f"{where} has no {key!r}", hint="every message needs both")
            if not isinstance(message[key], str):
                raise SettingError(
                    f"{where}: {key!r} must be a string, not {_show(message[key])}",
                    hint="send text content as a string",
                )
        for key, item in _strings(message, where):
            text(f"{where}: {key!r}", item)
        out.append(dict(message))
    return out


def _strings(message: Mapping[str, Any], where: str) -> Iterator[tuple[str, str]]:
    """Every string inside a message (keys and values) with where it is, walked without
    recursion; SettingError when it nests deeper than MAX_MESSAGE_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(message, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, Mapping | list | tuple):
            if depth > MAX_MESSAGE_DEPTH:
                raise SettingError(
                    f"{where}: nested deeper than {MAX_MESSAGE_DEPTH} levels",
                    hint="flatten the message's extra fields",
                )
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    yield f"{path}{key}", key
                stack.append((item, f"{path}{key}" if not path else f"{path}.{key}", depth + 1))
