"""What ``edgekit serve`` counts and times, for ``GET /metrics`` (docs/serving.md lists the
metrics): one ``Trace`` a request, filled in by the app as the request goes (received,
admitted, its generation begun, each chunk, its end), and ``ServeMetrics``, the registry
those events update.

Names: every metric is ``edgekit:``-prefixed. The seven that mean what llama.cpp's server
reports keep its names after the prefix, with its types and help texts
(``prompt_tokens_total``, ``prompt_tokens_cached_total``, ``prompt_seconds_total``,
``tokens_predicted_total``, ``tokens_predicted_seconds_total``, ``requests_processing``,
``requests_deferred``): a dashboard made for llama.cpp reads them after one relabelling
rule. The server runs several runtimes, so it does not claim llama.cpp's own prefix.

Times are the server's own (``time.monotonic``): time to first token runs from the
request's headers to its first generated token, end-to-end latency to its last byte.
Prompt seconds run from the generation's turn to its first token. The turn is the
server's account of the session's first-come-first-served slots (``Session.parallel``
of them; one today): a generation gets a slot when it asks for its first chunk if one is
free, else when the generation ahead of it ends.

Every method runs on the event loop, except ``busy_seconds`` (the power thread's), which
holds the registry's lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edgekit.serve_metrics import Registry
from edgekit.targets.handles import GenerationHandle
from edgekit.targets.values import StreamChunk

# Bucket bounds in seconds (+Inf is added): from a small model on a desktop to a large
# one on a Raspberry Pi.
TTFT_BUCKETS: tuple[float, ...] = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75),
    *(1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
ITL_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05),
    *(0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5),
)
E2E_BUCKETS: tuple[float, ...] = (
    *(0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0),
    *(20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0),
)

#: Endpoints a request is counted under; any other path is "other".
ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
GENERATION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
#: How a request ended (the ``outcome`` label).
OUTCOMES = ("completed", "refused", "busy", "failed", "client_gone")
#: The status counted for a client gone before any answer started (nginx's convention).
CLIENT_CLOSED = 499


@dataclass(kw_only=True, eq=False)
class Trace:
    """One HTTP request's account, filled in as it goes (a record, not a value)."""

    endpoint: str
    received: float
    outcome: str = "completed"
    handle: GenerationHandle | None = None
    begun: float | None = None  # its generation asked for its first chunk
    turn: float | None = None  # it got a slot
    first_token: float | None = None
    last_token: float | None = None
    prompt_counted: bool = False
    tokens: int = 0


@dataclass
class _Turns:
    """The server's account of the session's slots, first come first served."""

    holding: set[Trace] = field(default_factory=set)
    waiting: deque[Trace] = field(default_factory=deque)


class ServeMetrics:
    """The metrics of one server, and the request events that update them."""

    def __init__(self, *, model: str, target: str, slots: Callable[[], int]) -> None:
        self.registry = r = Registry()
        self._slots = slots
        self._admitted: set[Trace] = set()
        self._turns = _Turns()
        self._busy_total = 0.0  # seconds with at least one generation in flight
        self._busy_since: float | None = None
        self._in_flight = 0
        self.prompt_tokens = r.counter(
            "edgekit:prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
        )
        self.prompt_cached = r.counter(
            "edgekit:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"
        )
        self.prompt_seconds = r.counter(
            "edgekit:prompt_seconds_total", "Total time spent processing prompts"
        )
        self.predicted = r.counter(
            "edgekit:tokens_predicted_total", "Number of generation tokens processed"
        )
        self.predicted_seconds = r.counter(
            "edgekit:tokens_predicted_seconds_total", "Total time spent generating tokens"
        )
        r.gauge("edgekit:requests_processing", "Number of requests processing").read_from(
            lambda: {(): float(self.processing())}
        )
        r.gauge("edgekit:requests_deferred", "Number of requests deferred").read_from(
            lambda: {(): float(self.deferred())}
        )
        r.gauge("edgekit:slots", "Generations the server runs at once").read_from(
            lambda: {(): float(self._slots())}
        )
        self.requests = r.counter(
            "edgekit:requests_total",
            "HTTP requests answered, by endpoint, status code (499: the client left before "
            "an answer started) and outcome",
            ("endpoint", "status", "outcome"),
        )
        self.finish = r.counter(
            "edgekit:finish_reasons_total", "Generations ended, by finish reason", ("reason",)
        )
        self.ttft = r.histogram(
            "edgekit:time_to_first_token_seconds",
            "Time from a generation request's headers to its first generated token",
            TTFT_BUCKETS,
        )
        self.itl = r.histogram(
            "edgekit:inter_token_latency_seconds",
            "Time between two generated tokens of one request",
            ITL_BUCKETS,
        )
        self.e2e = r.histogram(
            "edgekit:e2e_request_latency_seconds",
            "Time from a completed generation request's headers to the end of its answer",
            E2E_BUCKETS,
        )
        info = r.gauge("edgekit:model_info", "The model served (value 1)", ("model", "target"))
        info.set(1, model, target)

    # --- gauges ---------------------------------------------------------------------------------

    def processing(self) -> int:
        """Admitted requests whose generation runs now (holds a slot in the runtime)."""
        return sum(
            1 for t in self._admitted if t.handle is not None and t.handle.state == "running"
        )

    def deferred(self) -> int:
        """Admitted requests waiting: their prompt being made, or their generation queued."""
        return sum(
            1 for t in self._admitted if t.handle is None or t.handle.state in ("pending", "queued")
        )

    def slots(self) -> int:
        return self._slots()

    def busy_seconds(self, now: float | None = None) -> float:
        """Seconds so far with at least one generation in flight (any thread)."""
        with self.registry.lock:
            now = time.monotonic() if now is None else now
            running = now - self._busy_since if self._busy_since is not None else 0.0
            return self._busy_total + running

    # --- a request's events ---------------------------------------------------------------------

    def received(self, path: str) -> Trace:
        endpoint = path if path in ENDPOINTS else "other"
        return Trace(endpoint=endpoint, received=time.monotonic())

    def admitted(self, trace: Trace) -> None:
        self._admitted.add(trace)

    def begun(self, trace: Trace, handle: GenerationHandle) -> None:
        """Its generation is asked for its first chunk (it queues for a slot)."""
        now = time.monotonic()
        trace.handle, trace.begun = handle, now
        with self.registry.lock:
            if self._in_flight == 0:
                self._busy_since = now
            self._in_flight += 1
        turns = self._turns
        if len(turns.holding) < max(1, self._slots()) and not turns.waiting:
            turns.holding.add(trace)
            trace.turn = now
        else:
            turns.waiting.append(trace)

    def chunk(self, trace: Trace, chunk: StreamChunk) -> None:
        now = time.monotonic()
        if chunk.finish_reason:
            self.finish.inc(1, chunk.finish_reason)
        if chunk.tokens <= 0:
            return
        if trace.first_token is None:
            trace.first_token = now
            self._count_prompt(trace)
            start = trace.turn if trace.turn is not None else trace.begun or now
            self.prompt_seconds.inc(max(0.0, now - start))
            self.ttft.observe(now - trace.received)
        elif trace.last_token is not None:
            gap = now - trace.last_token
            self.predicted_seconds.inc(gap)
            for _ in range(chunk.tokens):
                self.itl.observe(gap / chunk.tokens)
        trace.last_token = now
        trace.tokens += chunk.tokens
        self.predicted.inc(chunk.tokens)

    def ended(self, trace: Trace) -> None:
        """Its generation ended (finished, failed, or its client went away)."""
        now = time.monotonic()
        handle = trace.handle
        if handle is not None and handle.started:
            self._count_prompt(trace)
        self._admitted.discard(trace)
        with self.registry.lock:
            self._in_flight -= 1
            if self._in_flight == 0 and self._busy_since is not None:
                self._busy_total += now - self._busy_since
                self._busy_since = None
        turns = self._turns
        if trace in turns.holding:
            turns.holding.discard(trace)
            if turns.waiting:  # the slot goes to the generation queued longest
                nxt = turns.waiting.popleft()
                turns.holding.add(nxt)
                nxt.turn = now
        elif trace in turns.waiting:
            turns.waiting.remove(trace)

    def done(self, trace: Trace, status: int) -> None:
        """The request's answer ended (or never started: its client left)."""
        self._admitted.discard(trace)
        self.requests.inc(1, trace.endpoint, str(status), trace.outcome)
        if trace.outcome == "completed" and trace.endpoint in GENERATION_ENDPOINTS:
            self.e2e.observe(time.monotonic() - trace.received)

    def _count_prompt(self, trace: Trace) -> None:
        handle = trace.handle
        if trace.prompt_counted or handle is None:
            return
        trace.prompt_counted = True
        cached = _cached_tokens(handle)
        self.prompt_cached.inc(cached)
        self.prompt_tokens.inc(max(0, handle.prompt_tokens - cached))

    def render(self) -> str:
        return self.registry.render()


def _cached_tokens(handle: GenerationHandle) -> int:
    """Prompt tokens the runtime took from a cached prefix: a batched session's handle
    reports them (``cached_tokens``); a handle that does not reused none."""
    cached = getattr(handle, "cached_tokens", 0)
    return cached if isinstance(cached, int) and cached > 0 else 0
