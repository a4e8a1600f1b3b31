"""A small metrics registry and the Prometheus text exposition format (version 0.0.4),
with no dependency: counters, gauges and histograms with fixed buckets, each a family of
series told apart by label values.

Every update and every rendering holds the registry's lock, so the event loop, generation
threads and the power thread may all touch it. A gauge may instead be read from a function
when the registry is rendered (``Gauge.read_from``): the figure is then never stale.

The text follows the format exactly: one ``# HELP`` and one ``# TYPE`` line a family (help
text with ``\\`` and line feeds escaped), label values with ``\\``, ``"`` and line feeds
escaped (any other character, a model's hostile name included, is legal there), a
histogram as cumulative ``_bucket{le="..."}`` series ending in ``le="+Inf"``, then
``_sum`` and ``_count``; numbers as Go prints them (``+Inf``, ``-Inf``, ``NaN``). Label
values must come from bounded sets (status codes, endpoints, a sensor's name): every
value seen keeps its series for the life of the server.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence

from edgekit.errors import ServeError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HINT = "a metric is defined in edgekit's own code: this is a bug in edgekit"

Labels = tuple[str, ...]


def format_value(value: float) -> str:
    """A sample value as Prometheus reads it: integers without a fraction, floats by
    ``repr`` (shortest round trip), and the three special values by their names."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def escape_label_value(value: str) -> str:
    """A label value inside its double quotes: backslash, double quote and line feed
    escaped; a lone surrogate (not UTF-8) replaced."""
    text = value.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


class _Family:
    """One metric: a name, its help, its type, its label names, and a series for each
    set of label values seen."""

    kind = ""

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], lock: threading.RLock
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ServeError(f"{name!r} is not a Prometheus metric name", hint=_HINT)
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__") or label == "le":
                raise ServeError(f"{label!r} is not a label name edgekit may use", hint=_HINT)
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self._lock = lock

    def _key(self, values: Sequence[str]) -> Labels:
        if len(values) != len(self.labels):
            raise ServeError(
                f"{self.name} takes the labels {self.labels}, not {len(values)} values",
                hint=_HINT,
            )
        return tuple(str(v) for v in values)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Family):
    """A total that only goes up (from 0 when the server started)."""

    kind = "counter"

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], lock: threading.RLock
    ) -> None:
        super().__init__(name, help_text, labels, lock)
        self._values: dict[Labels, float] = {} if self.labels else {(): 0.0}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        if not amount >= 0:  # NaN too
            raise ServeError(f"{self.name} cannot go down (by {amount!r})", hint=_HINT)
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def lines(self) -> list[str]:
        return [
            f"{self.name}{_label_text(self.labels, key)} {format_value(v)}"
            for key, v in sorted(self._values.items())
        ]


class Gauge(_Family):
    """A figure that goes up and down; set it, or let it be read when rendered."""

    kind = "gauge"

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], lock: threading.RLock
    ) -> None:
        super().__init__(name, help_text, labels, lock)
        self._values: dict[Labels, float] = {} if self.labels else {(): 0.0}
        self._read: Callable[[], dict[Labels, float]] | None = None

    def set(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def read_from(self, read: Callable[[], dict[Labels, float]]) -> None:
        """Take the series from ``read()`` (label values -> figure) at each rendering."""
        self._read = read

    def value(self, *labels: str) -> float:
        key = self._key(labels)
        values = self._read() if self._read is not None else self._values
        return values.get(key, math.nan)

    def lines(self) -> list[str]:
        values = self._read() if self._read is not None else self._values
        return [
            f"{self.name}{_label_text(self.labels, self._key(key))} {format_value(v)}"
            for key, v in sorted(values.items())
        ]


class Histogram(_Family):
    """Observations counted into fixed buckets (upper bounds, increasing), with their sum."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        lock: threading.RLock,
        buckets: Sequence[float],
    ) -> None:
        super().__init__(name, help_text, labels, lock)
        bounds = [float(b) for b in buckets if not math.isinf(b)]
        if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
            raise ServeError(f"{name}'s buckets must be finite and increasing", hint=_HINT)
        self.buckets = (*bounds, math.inf)
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}  # counts, [sum]
        if not self.labels:
            self._series[()] = ([0] * len(self.buckets), [0.0])

    def observe(self, value: float, *labels: str) -> None:
        if math.isnan(value):
            return  # no bucket holds it, and it would poison the sum
        key = self._key(labels)
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * len(self.buckets), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            total[0] += value

    def count(self, *labels: str) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return sum(series[0]) if series else 0

    def lines(self) -> list[str]:
        out = []
        names = (*self.labels, "le")
        for key, (counts, total) in sorted(self._series.items()):
            running = 0
            for bound, n in zip(self.buckets, counts, strict=True):
                running += n
                out.append(
                    f"{self.name}_bucket{_label_text(names, (*key, format_value(bound)))} {running}"
                )
            labels = _label_text(self.labels, key)
            out.append(f"{self.name}_sum{labels} {format_value(total[0])}")
            out.append(f"{self.name}_count{labels} {running}")
        return out


class Registry:
    """The metrics of one server, rendered in the order they were made."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._families: dict[str, _Family] = {}

    def _add(self, family: _Family) -> None:
        if family.name in self._families:
            raise ServeError(f"the metric {family.name} is defined twice", hint=_HINT)
        self._families[family.name] = family

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        family = Counter(name, help_text, labels, self.lock)
        self._add(family)
        return family

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        family = Gauge(name, help_text, labels, self.lock)
        self._add(family)
        return family

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        family = Histogram(name, help_text, labels, self.lock, buckets)
        self._add(family)
        return family

    def render(self) -> str:
        """The text exposition of every metric (a family with no series yet shows its
        HELP and TYPE lines only)."""
        out: list[str] = []
        with self.lock:
            for family in self._families.values():
                out += family.header()
                out += family.lines()
        return "\n".join(out) + "\n"
