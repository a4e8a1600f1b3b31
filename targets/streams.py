"""Generated text as it streams: stop strings cut it, UTF-8 is decoded across tokens.

Both are target-independent: every runtime's ``stream_tokens`` feeds its pieces through
them, so a stream never shows half of a stop string or half of a character.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class StopMatcher:
    """Cuts generated text at the first stop string, holding back any tail that could
    still turn into one (so a stream never shows half of a stop string)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached."""
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = max((_overlap(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


class Utf8Stream:
    """Decodes token bytes incrementally: a character split across tokens is emitted
    once complete, never as replacement characters."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self.decoder.decode(data)

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)
