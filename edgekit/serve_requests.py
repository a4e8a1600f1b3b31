"""The one reader of ``edgekit serve`` request bodies: OpenAI's completions and chat schema.

A request body comes from any client, so it is read like any untrusted document
(``edgekit.untrusted.parse_json``: bounded size and depth, UTF-8, no repeated keys, no
NaN) and then every field is checked against the OpenAI schema before anything reaches
the Session: its JSON type (``true`` is not an integer, ``"false"`` is not a boolean,
``1.5`` is not a seed), its range, and whether this server supports it (tool calls,
logprobs or several choices are refused, not silently ignored). Unknown fields are
refused, as the OpenAI API does. Every refusal is a ``RequestError`` naming the field,
which the server answers with 400.

Three fields beyond the OpenAI schema are accepted because every target honours them:
``top_k``, ``min_p`` and ``repeat_penalty``.

What comes out is a ``GenerationRequest``: plain text messages (``developer`` is sent to
the template as ``system``, text parts are joined with newlines) or a prompt, and a
``Sampling`` made for this request alone (its seed included: nothing a request asks for
outlives it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.errors import EdgekitError, RequestError
from edgekit.targets.values import Sampling

#: Deeper than any valid request (messages > message > content parts > part is 5).
MAX_DEPTH = 16
#: OpenAI accepts at most four stop sequences.
MAX_STOP = 4
DEFAULT_MAX_TOKENS = 256
#: llama.cpp reads 2**32 - 1 as "draw a random seed": the largest repeatable seed is one less.
MAX_SEED = 2**32 - 2
ROLES = ("system", "developer", "user", "assistant")
# A role the template knows by another name.
TEMPLATE_ROLE = {"developer": "system"}
# Fields of a message an OpenAI client may echo back from an earlier answer; accepted empty.
ECHOED_MESSAGE_FIELDS = ("refusal", "tool_calls", "function_call", "audio", "annotations")

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """A checked request: what to generate from, how, and how to answer."""

    chat: bool
    messages: tuple[dict[str, str], ...]  # chat: role and text content only
    prompt: str  # completions
    sampling: Sampling
    stream: bool
    include_usage: bool


def read_request(
    raw: bytes, *, chat: bool, max_bytes: int, max_tokens_limit: int
) -> GenerationRequest:
    """Read a ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` body.

    Raises:
        RequestError: the body is not a JSON object within the bounds, or a field is
            unknown, of the wrong type, out of range or not supported here.
    """
    from edgekit.untrusted import parse_json

    body = parse_json(
        raw,
        where="the request body",
        max_bytes=max_bytes,
        max_depth=MAX_DEPTH,
        error=RequestError,
    )
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {_kind(body)}")
    _no_surrogates(body, "")
    fields = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    for key in body:
        if key not in fields:
            raise RequestError(
                f"unrecognized request argument {_show(key)}: this endpoint takes "
                f"{', '.join(sorted(fields))}",
                param=key,
            )
    for key, check in fields.items():
        check(body, key)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise RequestError(
            "'stream_options' is only allowed when 'stream' is true", param="stream_options"
        )
    return GenerationRequest(
        chat=chat,
        messages=_messages(body) if chat else (),
        prompt="" if chat else _prompt(body),
        sampling=_sampling(body, chat=chat, limit=max_tokens_limit),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
    )


# --- JSON types ------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _no_surrogates(value: Any, where: str) -> None:
    """Every string of the body (keys too) must be valid Unicode: JSON can spell a lone
    surrogate (``"\\ud800"``), which no tokenizer can encode."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            bad = _SURROGATE.search(item)
            if bad:
                raise RequestError(
                    f"{path or 'the request'} contains a lone surrogate "
                    f"(U+{ord(bad.group()):04X}): it is not valid Unicode text",
                    param=None if path.startswith("a field") else path.split(".")[0].split("[")[0],
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, f"a field name in {path or 'the body'}"))
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _type_error(key: str, expected: str, value: Any) -> RequestError:
    return RequestError(f"'{key}' must be {expected}, not {_kind(value)}", param=key)


def _integer(body: dict[str, Any], key: str, *, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise _type_error(key, "an integer", value)
    if not low <= value <= high:
        raise RequestError(
            f"'{key}' is {_show(value)}: it must be an integer from {low} to {high}", param=key
        )
    return value


def _number(
    body: dict[str, Any], key: str, *, low: float, high: float, low_open: bool = False
) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(key, "a number", value)
    x = float(value)
    valid = f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
    if not math.isfinite(x) or (x <= low if low_open else x < low) or x > high:
        raise RequestError(f"'{key}' is {_show(value)}: it must be {valid}", param=key)
    return x


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(key, "true or false", value)
    return value


def _string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise _type_error(key, "a string", value)
    return value


def _unsupported(
    body: dict[str, Any], key: str, *, what: str, empty: Callable[[Any], bool]
) -> None:
    value = body.get(key)
    if value is not None and not empty(value):
        raise RequestError(f"'{key}' is not supported by this server ({what})", param=key)


# --- the fields -------------------------------------------------------------------------------


def _check_stop(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError(
            f"'stop' must be a string or an array of strings, not {_kind(value)}"
            + ("" if not isinstance(value, list) else " holding other values"),
            param="stop",
        )
    if len(value) > MAX_STOP:
        raise RequestError(
            f"'stop' has {len(value)} strings: at most {MAX_STOP} are allowed", param="stop"
        )


def _check_stream_options(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict):
        raise _type_error(key, "an object", value)
    for name, item in value.items():
        if name not in ("include_usage", "include_obfuscation"):
            raise RequestError(f"unknown field {_show(name)} in 'stream_options'", param=key)
        if not isinstance(item, bool):
            raise _type_error(f"stream_options.{name}", "true or false", item)


def _check_metadata(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _type_error(key, "an object of strings", value)


def _check_response_format(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict):
        raise _type_error(key, "an object", value)
    if value != {"type": "text"}:
        raise RequestError(
            '\'response_format\' is not supported by this server beyond {"type": "text"} '
            "(no JSON mode or schema)",
            param=key,
        )


def _typed(check: Callable[[dict[str, Any], str], Any]) -> Callable[[dict[str, Any], str], None]:
    def run(body: dict[str, Any], key: str) -> None:
        check(body, key)

    return run


def _zero_penalty(body: dict[str, Any], key: str) -> None:
    value = _number(body, key, low=-2.0, high=2.0)
    if value:
        raise RequestError(
            f"'{key}' is not supported by this server (only 0); use 'repeat_penalty' instead",
            param=key,
        )


def _nothing(body: dict[str, Any], key: str) -> None:
    """Fields read in ``read_request`` itself (the prompt, the messages, the sampling)."""


def _empty(value: Any) -> bool:
    return value in ([], {}, "none", False, 0)


_COMMON: dict[str, Callable[[dict[str, Any], str], None]] = {
    "model": _typed(_string),
    "max_tokens": _nothing,
    "temperature": _nothing,
    "top_p": _nothing,
    "top_k": _nothing,
    "min_p": _nothing,
    "repeat_penalty": _nothing,
    "n": _nothing,
    "seed": _nothing,
    "stop": _check_stop,
    "stream": _typed(_flag),
    "stream_options": _check_stream_options,
    "frequency_penalty": _zero_penalty,
    "presence_penalty": _zero_penalty,
    "logit_bias": lambda b, k: _unsupported(b, k, what="no logit bias", empty=_empty),
    "user": _typed(_string),
}
_CHAT_FIELDS: dict[str, Callable[[dict[str, Any], str], None]] = {
    **_COMMON,
    "messages": _nothing,
    "max_completion_tokens": _nothing,
    "logprobs": lambda b, k: _unsupported(b, k, what="no logprobs", empty=_empty),
    "top_logprobs": lambda b, k: _unsupported(b, k, what="no logprobs", empty=_empty),
    "response_format": _check_response_format,
    "tools": lambda b, k: _unsupported(b, k, what="no tool calling", empty=_empty),
    "tool_choice": lambda b, k: _unsupported(b, k, what="no tool calling", empty=_empty),
    "functions": lambda b, k: _unsupported(b, k, what="no function calling", empty=_empty),
    "function_call": lambda b, k: _unsupported(b, k, what="no function calling", empty=_empty),
    "parallel_tool_calls": _typed(_flag),
    "store": _typed(_flag),
    "metadata": _check_metadata,
    "service_tier": _typed(_string),
}
_COMPLETION_FIELDS: dict[str, Callable[[dict[str, Any], str], None]] = {
    **_COMMON,
    "prompt": _nothing,
    "logprobs": lambda b, k: _unsupported(b, k, what="no logprobs", empty=_empty),
    "echo": lambda b, k: _unsupported(b, k, what="no echo", empty=lambda v: v is False),
    "suffix": lambda b, k: _unsupported(b, k, what="no suffix", empty=lambda v: v == ""),
    "best_of": lambda b, k: _unsupported(b, k, what="only best_of 1", empty=lambda v: v == 1),
}


def _max_tokens(body: dict[str, Any], key: str, limit: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise _type_error(key, "an integer", value)
    if value < 1:
        raise RequestError(f"'{key}' must be at least 1, not {value}", param=key)
    if value > limit:
        raise RequestError(
            f"'{key}' {_show(value)} is over this server's limit of {limit}",
            param=key,
            hint="ask for fewer tokens, or start the server with a larger --max-tokens-limit",
        )
    return value


def _sampling(body: dict[str, Any], *, chat: bool, limit: int) -> Sampling:
    asked = _max_tokens(body, "max_tokens", limit)
    if chat:
        asked = _max_tokens(body, "max_completion_tokens", limit) or asked
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise RequestError(
            "'n' must be 1: this server answers with one choice"
            + ("" if type(n) is int else f", not {_kind(n)}"),
            param="n",
        )
    stop = body.get("stop")
    values: dict[str, Any] = {
        "max_tokens": asked or min(DEFAULT_MAX_TOKENS, limit),
        "temperature": _number(body, "temperature", low=0.0, high=2.0),
        "top_p": _number(body, "top_p", low=0.0, high=1.0, low_open=True),
        "top_k": _integer(body, "top_k", low=0, high=2**31 - 1),
        "min_p": _number(body, "min_p", low=0.0, high=1.0),
        "repeat_penalty": _number(body, "repeat_penalty", low=0.0, high=10.0, low_open=True),
        "seed": _integer(body, "seed", low=0, high=MAX_SEED),
        "stop": () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop),
    }
    try:
        return Sampling(**{k: v for k, v in values.items() if v is not None})
    except EdgekitError as exc:  # Sampling's own checks: a range this module did not know
        raise RequestError(exc.message, hint=exc.hint) from exc


def _prompt(body: dict[str, Any]) -> str:
    if "prompt" not in body:
        raise RequestError("'prompt' is required", param="prompt")
    value = body["prompt"]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        raise RequestError(
            f"'prompt' holds {len(value)} strings, which asks for {len(value)} completions: "
            "this server answers one prompt a request",
            param="prompt",
        )
    if isinstance(value, list) and all(isinstance(v, int | list) for v in value):
        raise RequestError(
            "'prompt' as token ids is not supported by this server: send it as a string",
            param="prompt",
        )
    if not isinstance(value, str):
        raise _type_error("prompt", "a string", value)
    if not value:
        raise RequestError("'prompt' is empty: send some text to continue", param="prompt")
    return value


def _messages(body: dict[str, Any]) -> tuple[dict[str, str], ...]:
    if "messages" not in body:
        raise RequestError("'messages' is required", param="messages")
    value = body["messages"]
    if not isinstance(value, list):
        raise _type_error("messages", "an array of message objects", value)
    if not value:
        raise RequestError("'messages' is empty: send at least one message", param="messages")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(value))


def _message(message: Any, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise RequestError(f"'{where}' must be an object, not {_kind(message)}", param="messages")
    for key, item in message.items():
        if key in ECHOED_MESSAGE_FIELDS:
            if item not in (None, []):
                raise RequestError(
                    f"'{where}.{key}' is not supported by this server (no tool calling, no audio)",
                    param="messages",
                )
        elif key not in ("role", "content", "name"):
            raise RequestError(
                f"'{where}' has an unknown field {_show(key)}: a message has role, content "
                "and name",
                param="messages",
            )
    role = message.get("role")
    if role is None:
        raise RequestError(f"'{where}.role' is required", param="messages")
    if not isinstance(role, str):
        raise _type_error(f"{where}.role", "a string", role)
    if role in ("tool", "function"):
        raise RequestError(
            f"'{where}.role' is {role!r}: tool messages are not supported (this server has "
            "no tool calling)",
            param="messages",
        )
    if role not in ROLES:
        raise RequestError(
            f"'{where}.role' is {_show(role)}: it must be one of {', '.join(ROLES)}",
            param="messages",
        )
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise _type_error(f"{where}.name", "a string", name)
    return {"role": TEMPLATE_ROLE.get(role, role), "content": _content(message, where)}


def _content(message: dict[str, Any], where: str) -> str:
    if "content" not in message:
        raise RequestError(f"'{where}.content' is required", param="messages")
    content = message["content"]
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _type_error(f"{where}.content", "a string or an array of text parts", content)
    if not content:
        raise RequestError(f"'{where}.content' is an empty array of parts", param="messages")
    texts = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        if not isinstance(part, dict):
            raise _type_error(at, 'a {"type": "text", "text": ...} part', part)
        kind = part.get("type")
        if kind != "text":
            raise RequestError(
                f"'{at}' is a {_show(kind)} part: only text content parts are supported",
                param="messages",
            )
        unknown = [k for k in part if k not in ("type", "text")]
        if unknown:
            raise RequestError(f"'{at}' has an unknown field {_show(unknown[0])}", param="messages")
        text = part.get("text")
        if not isinstance(text, str):
            raise _type_error(f"{at}.text", "a string", text)
        texts.append(text)
    return "\n".join(texts)
