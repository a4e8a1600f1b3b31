"""Tokens from a variant folder's Hugging Face tokenizer files, for the sessions that run
them with Hugging Face ``tokenizers`` (the library transformers runs) instead of their
runtime's own tokenizer: the ONNX Runtime GenAI session (targets/onnx_runtime.py says why)
and the MLX session.

- ``read_tokenizer_files``: what the files say beyond tokenizer.json (the chat template,
  BOS/EOS texts, the special tokens), each file a regular file inside the folder (no link),
  bounded in size and parsed as strict JSON.
- ``open_tokenizer``: tokenizer.json as transformers runs it (no truncation, no padding).
- ``TextStream``: a generation's text, complete UTF-8 only, cut by the stop strings.

The folder's own module says what kind of folder it is and how to rebuild one (``kind``
and ``hint``), so its errors read as before this was shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.targets.streams import StopMatcher

from edgekit.errors import ModelFormatError
from edgekit.safe_files import UnsafePathError, open_regular
from edgekit.untrusted import parse_json

JSON_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is about 35 MB


@dataclass(frozen=True, kw_only=True)
class TokenizerFiles:
    """What the Hugging Face tokenizer files say beyond tokenizer.json's tokenizer."""

    template: str | None  # the chat template (chat_template.jinja or tokenizer_config)
    bos: str  # BOS / EOS texts, for the template
    eos: str
    specials: tuple[str, ...]  # every special token's text


def read_bytes(folder: Path, name: str, max_bytes: int, *, kind: str, hint: str) -> bytes:
    """Up to ``max_bytes`` + 1 bytes of the regular file ``folder/name`` (no link).

    Raises:
        ModelFormatError: not a regular file inside the folder (missing, a link, a FIFO),
            saying the folder is not ``kind``.
    """
    try:
        fd = open_regular(folder, name)
    except UnsafePathError as exc:
        raise ModelFormatError(
            f"{folder}: {exc.message}, so this is not {kind}", hint=hint
        ) from exc
    with open(fd, "rb") as f:
        return f.read(max_bytes + 1)


def read_json(
    folder: Path, name: str, max_bytes: int, *, kind: str, hint: str, depth: bool = True
) -> Any:
    """The JSON document ``folder/name``, read from a regular file inside the folder."""
    data = read_bytes(folder, name, max_bytes, kind=kind, hint=hint)
    return parse_json(
        data,
        where=str(folder / name),
        max_bytes=max_bytes,
        max_depth=None if not depth else 32,
        error=ModelFormatError,
        hint=hint,
    )


def read_tokenizer_files(folder: Path, *, kind: str, hint: str) -> TokenizerFiles:
    """The chat template, BOS/EOS texts and special tokens.

    Raises:
        ModelFormatError: tokenizer.json is missing or malformed (the session's tokenizer
            needs it).
    """
    tokenizer = _object_or_empty(
        read_json(folder, "tokenizer.json", JSON_BYTES, kind=kind, hint=hint, depth=False)
    )
    tok_config: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():
        tok_config = _object_or_empty(
            read_json(folder, "tokenizer_config.json", JSON_BYTES, kind=kind, hint=hint)
        )
    template: Any = tok_config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        data = read_bytes(folder, "chat_template.jinja", JSON_BYTES, kind=kind, hint=hint)
        template = data[:JSON_BYTES].decode("utf-8", errors="replace")
    added = tokenizer.get("added_tokens")
    tokens: list[Any] = list(added) if isinstance(added, list) else []
    decoder = tok_config.get("added_tokens_decoder")
    tokens += list(decoder.values()) if isinstance(decoder, dict) else []
    specials = {
        t["content"]
        for t in tokens
        if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str)
    }
    bos, eos = _token_text(tok_config.get("bos_token")), _token_text(tok_config.get("eos_token"))
    return TokenizerFiles(
        template=template if isinstance(template, str) else None,
        bos=bos,
        eos=eos,
        specials=tuple(sorted(t for t in specials | {bos, eos} if t)),
    )


def _object_or_empty(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # older tokenizer configs store AddedToken dicts
        value = value.get("content")
    return value if isinstance(value, str) else ""


def open_tokenizer(cls: Any, folder: Path) -> Any:
    """The Hugging Face tokenizer (``cls``: ``tokenizers.Tokenizer``) of the folder's
    tokenizer.json, as transformers runs it: no truncation or padding (a tokenizer.json
    may carry either)."""
    tokenizer = cls.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def bos_added(tokenizer: Any, token: str) -> bool:
    """Whether tokenization with special tokens puts ``token`` first (BOS)."""
    ids = tokenizer.encode("a", add_special_tokens=True).ids
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    return len(ids) > len(plain) and tokenizer.id_to_token(ids[0]) == token


class TextStream:
    """A generation's text: ``tokenizers``' DecodeStream, which holds back the bytes of a
    character not yet complete, cut by the stop strings; at the end, what it still holds
    comes out as ``detokenize`` gives it (replacement characters included), so a stream
    always reads as the detokenized tokens."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream: Any = DecodeStream(skip_special_tokens=True)
        self._stops = StopMatcher(stop)
        self._ids: list[int] = []
        self._decoded: list[str] = []

    def feed(self, token: int) -> tuple[str, bool]:
        self._ids.append(token)
        piece = self._step(token)
        self._decoded.append(piece)
        return self._stops.feed(piece)

    def _step(self, token: int) -> str:
        """The text ``token`` completes. DecodeStream refuses some byte-fallback runs
        (tokenizers 0.22: "Invalid prefix encountered while decoding stream", seen on a
        tiny random Phi-3 vocabulary): from then on the text is what the whole decode
        adds, replacement characters at its end held back (a character may be
        incomplete; ``end`` gives what is still held)."""
        if self._stream is not None:
            try:
                return str(self._stream.step(self._tokenizer, token) or "")
            except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception here
                self._stream = None
        whole = str(self._tokenizer.decode(self._ids, skip_special_tokens=True))
        shown = "".join(self._decoded)
        return whole[len(shown) :].rstrip("\ufffd") if whole.startswith(shown) else ""

    def end(self) -> str:
        """What is left: the stream's held-back tail, then the stop matcher's."""
        shown = "".join(self._decoded)
        whole = str(self._tokenizer.decode(self._ids, skip_special_tokens=True))
        tail = whole[len(shown) :] if whole.startswith(shown) else ""
        text, stopped = self._stops.feed(tail)
        return text if stopped else text + self._stops.flush()
