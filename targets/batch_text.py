"""Text of a batched generation as its token ids arrive, for any tokenizer.

A batched runtime gives token ids; the session's ``detokenize`` turns ids into text. A
token's own text is not always its share of the whole (a SentencePiece word-start marker
becomes a space only after another token, a character may span byte-level tokens), so
the text is decoded over a short window of recent ids and only what the window adds is
emitted, held back while it ends in an incomplete character (U+FFFD). This is the offset
rule of Hugging Face's text streamers and of the serving engines that stream text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edgekit.targets.streams import StopMatcher

Detokenize = Callable[[Sequence[int]], str]
_INCOMPLETE = "\ufffd"
CONTEXT_IDS = 5  # prompt ids the window starts with (as vLLM's incremental detokenizer)


class TokenText:
    """Turns a growing list of token ids into text pieces, cut at stop strings."""

    def __init__(
        self, detokenize: Detokenize, stops: Sequence[str], prompt: Sequence[int] = ()
    ) -> None:
        self._detokenize = detokenize
        # the window opens on the prompt's last ids: the first generated word's space is
        # then the one it has after the prompt (a decoder drops a leading one)
        self._ids: list[int] = list(prompt[-CONTEXT_IDS:])
        self._prefix = 0  # where the decoding window starts
        self._read = len(self._ids)  # ids before this are emitted (or the prompt's)
        self._stops = StopMatcher(stops)

    def feed(self, ids: Sequence[int]) -> tuple[str, bool]:
        """The text ``ids`` complete (safe to show now) and whether a stop string was
        reached (the text is cut before it then)."""
        self._ids.extend(ids)
        before = self._detokenize(self._ids[self._prefix : self._read])
        now = self._detokenize(self._ids[self._prefix :])
        if len(now) <= len(before) or now.endswith(_INCOMPLETE):
            return "", False  # nothing new yet, or half a character
        piece = now[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        return self._stops.feed(piece)

    def flush(self) -> str:
        """What is held back, at the end of the generation (a stop string's start that
        never completed, an incomplete character as U+FFFD)."""
        tail = ""
        if self._read < len(self._ids):
            before = self._detokenize(self._ids[self._prefix : self._read])
            tail = self._detokenize(self._ids[self._prefix :])[len(before) :]
            self._prefix = self._read = len(self._ids)
        text, _ = self._stops.feed(tail)
        return text + self._stops.flush()
