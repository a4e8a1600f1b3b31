"""``edgekit loadtest``: load any OpenAI-compatible server (edgekit's own, llama.cpp's,
Ollama's, LM Studio's) and report throughput, latency percentiles and errors.

A run is a sweep of levels, each bounded by ``requests`` and ``duration_s`` (whichever
comes first; the requests in flight then finish, each within ``timeout_s``):

- closed loop, ``concurrency``: N clients, each sending its next request when the last
  one ended;
- open loop, ``rates``: requests arrive at R a second whatever the server does, as a
  Poisson process (exponential gaps, seeded: the same arrivals every run) or at a fixed
  interval. A server that falls behind builds a queue, which is what this measures.

Every request streams (so time to first token and the gaps between tokens are seen),
asks for the usage counts (``stream_options.include_usage``) and uses them where the
server sends them. Prompts are made of common English words, one token each in the
usual tokenizers (so ``prompt_tokens`` words are about that many tokens: the server's own
count is reported beside it); each begins with its request's number, so no two share a
prefix a cache could reuse. Greedy sampling; the server may stop before ``max_tokens``.

Only loopback addresses are loaded unless ``allow_remote``: a load test is a flood. When
the server is local and exposes edgekit's ``/metrics`` with power figures, each level
reports the energy per generated token, labelled with the sensor it came from.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from edgekit import __version__
from edgekit.errors import ServeError
from edgekit.loadtest_client import RequestRecord, Server, get, request_body, stream_one
from edgekit.loadtest_stats import Energy, LevelResult, LoadTestResult, Mode, summarize
from edgekit.serve_config import is_loopback
from edgekit.untrusted import clean_text

_WORDS_TEXT = (
    "the time people way year work world life day part child eye woman place week case "
    "point number group problem fact hand home water room mother area money story month "
    "night book word side kind head house service friend father power hour game line end "
    "member law car city name team minute idea kid body back parent face level office door "
    "health person art war history party result change morning reason research girl guy"
)
WORDS = tuple(_WORDS_TEXT.split(" "))
PROMPT_NOTE = "words: about one token a word; the server's usage counts are reported beside"
MAX_IN_FLIGHT = 512  # open loop: arrivals beyond this many unanswered are dropped (errors)
SETTLE_S = 1.2  # after a level, before reading /metrics: the server's power thread ticks
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


@dataclass(frozen=True, kw_only=True)
class LoadPlan:
    """What to load and how (checked when made: ServeError)."""

    url: str
    endpoint: Literal["completions", "chat"] = "completions"
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()  # requests a second
    arrival: Literal["poisson", "fixed"] = "poisson"
    seed: int = 0
    requests: int = 32  # at most, each level
    duration_s: float = 60.0  # at most, each level (no request starts after it)
    prompt_tokens: int = 128
    max_tokens: int = 64
    timeout_s: float = 120.0  # one request, from sending it to its last byte
    warmup: int = 1  # requests sent before the first level, not counted
    allow_remote: bool = False

    def __post_init__(self) -> None:
        if not self.concurrency and not self.rates:
            object.__setattr__(self, "concurrency", (1,))
        _within("--concurrency", self.concurrency, 1, 1024)
        _within("--rate", self.rates, 1e-3, 10_000)
        _within("--requests", (self.requests,), 1, 100_000)
        _within("--duration", (self.duration_s,), 1e-3, 86_400)
        _within("--prompt-tokens", (self.prompt_tokens,), 1, 131_072)
        _within("--max-tokens", (self.max_tokens,), 1, 131_072)
        _within("--timeout", (self.timeout_s,), 1e-3, 86_400)
        _within("--warmup", (self.warmup,), 0, 100)
        if self.endpoint not in ("completions", "chat"):
            raise ServeError(
                f"unknown endpoint {clean_text(self.endpoint)!r}", hint="pass completions or chat"
            )
        if self.arrival not in ("poisson", "fixed"):
            raise ServeError(
                f"unknown arrival {clean_text(self.arrival)!r}", hint="pass poisson or fixed"
            )


def _within(flag: str, values: tuple[float, ...], low: float, high: float) -> None:
    for v in values:
        if isinstance(v, bool) or not low <= v <= high:  # NaN too
            raise ServeError(
                f"{flag} {v!r} is out of range", hint=f"pass a number from {low:g} to {high:g}"
            )


def server_for(plan: LoadPlan) -> tuple[Server, bool]:
    """The server ``plan`` loads, and whether it is on this machine (loopback).

    Raises:
        ServeError: the URL is not http(s), or not loopback without ``allow_remote``.
    """
    server = Server.from_url(plan.url, api_key=plan.api_key, timeout_s=plan.timeout_s)
    local = is_loopback(server.host)
    if not local and not plan.allow_remote:
        raise ServeError(
            f"{clean_text(server.host)} is not this machine: a load test floods the server "
            "it is pointed at",
            hint="load a server on 127.0.0.1, or pass --allow-remote for one you run",
        )
    return server, local


def prompt_text(words: int, index: int) -> str:
    """About ``words`` tokens of text, starting with the request's number."""
    start = index * 7 % len(WORDS)
    body = [WORDS[(start + i) % len(WORDS)] for i in range(max(0, words - 2))]
    return f"{index}. " + " ".join(body)


def run_loadtest(
    plan: LoadPlan,
    *,
    progress: Callable[[str], None] | None = None,
    level_done: Callable[[LevelResult], None] | None = None,
    stop: threading.Event | None = None,
) -> LoadTestResult:
    """Run the sweep ``plan`` describes (concurrency levels, then rates).

    ``progress`` is told each level as it starts, ``level_done`` gets each level's result
    as it ends (both on this thread, between levels: nothing measured waits for them).
    Once ``stop`` is set no request starts, streams in flight are cut at their next line
    (one the server has not begun to answer waits for its first line, or its timeout), and
    the result holds the levels that ended before (the one cut short is left out).

    Raises:
        ServeError: the URL is refused (``server_for``), the server lists no model, or
            the warm-up request fails.
    """
    server, local = server_for(plan)
    model = plan.model or first_model(server)
    body = _bodies(plan, model)
    for i in range(plan.warmup):
        if _stopped(stop):
            break
        record = stream_one(server, plan.endpoint, body(-1 - i), index=-1 - i, t0=0.0, stop=stop)
        if not record.ok and not _stopped(stop):
            raise ServeError(
                f"the warm-up request failed: {record.error}",
                hint="check the URL, the model name (--model) and the API key (--api-key)",
            )
    levels: list[LevelResult] = []
    sweep: list[tuple[Mode, float]] = [("concurrency", c) for c in plan.concurrency]
    sweep += [("rate", r) for r in plan.rates]
    for mode, value in sweep:
        if _stopped(stop):
            break
        if progress is not None:
            progress(f"{value:g} clients at once" if mode == "concurrency" else f"{value:g}/s")
        before = read_power(server) if local else None
        if mode == "concurrency":
            records, duration = closed_loop(server, plan, int(value), body, stop=stop)
        else:
            records, duration = open_loop(server, plan, value, body, stop=stop)
        if _stopped(stop):
            break  # cut short: its figures would mix finished and cut requests
        energy = None
        if before is not None and not _wait(stop, SETTLE_S):
            energy = energy_between(before, read_power(server))
        # stopped while the server's power reading settled: every request ended, so the
        # level stands, without its energy
        levels.append(summarize(mode, value, records, duration, energy))
        if level_done is not None:
            level_done(levels[-1])
    return LoadTestResult(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        edgekit_version=__version__,
        url=server.origin + server.base_path,
        endpoint=plan.endpoint,
        model=model,
        prompt_tokens=plan.prompt_tokens,
        prompt_note=PROMPT_NOTE,
        max_tokens=plan.max_tokens,
        arrival=plan.arrival,
        requests_per_level=plan.requests,
        duration_s=plan.duration_s,
        levels=tuple(levels),
    )


def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def _wait(stop: threading.Event | None, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile: whether it was."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


def _bodies(plan: LoadPlan, model: str) -> Callable[[int], dict[str, Any]]:
    def body(index: int) -> dict[str, Any]:
        text = prompt_text(plan.prompt_tokens, index)
        return request_body(plan.endpoint, model, text, plan.max_tokens, seed=plan.seed)

    return body


def first_model(server: Server) -> str:
    """The first model ``GET /v1/models`` lists.

    Raises:
        ServeError: no answer, or no model in it.
    """
    where = f"{server.origin}{server.base_path}/models"
    try:
        status, raw = get(server, server.base_path + "/models")
        if status != 200:
            raise ServeError(
                f"{where} answered HTTP {status}",
                hint="pass the API key with --api-key, or the model's name with --model",
            )
        data = json.loads(raw)
        name = data["data"][0]["id"] if isinstance(data, dict) else None
    except (OSError, http.client.HTTPException, ValueError, LookupError, TypeError) as exc:
        raise ServeError(
            f"cannot list the models at {server.origin}: {clean_text(exc, max_len=200)}",
            hint="check that the server runs there, or pass --model",
        ) from exc
    if not isinstance(name, str) or not name:
        raise ServeError(
            f"{where} lists no model",
            hint="pass the model's name with --model",
        )
    return name


# --- the two kinds of level ----------------------------------------------------------------


Body = Callable[[int], dict[str, Any]]


def closed_loop(
    server: Server,
    plan: LoadPlan,
    clients: int,
    body: Body,
    *,
    stop: threading.Event | None = None,
) -> tuple[list[RequestRecord], float]:
    """``clients`` threads, each sending its next request when the last one ended (none
    once ``stop`` is set)."""
    t0 = time.perf_counter()
    deadline = t0 + plan.duration_s
    numbers = itertools.count()
    lock = threading.Lock()
    records: list[RequestRecord] = []

    def client() -> None:
        while True:
            with lock:
                index = next(numbers)
            if index >= plan.requests or time.perf_counter() >= deadline or _stopped(stop):
                return
            record = stream_one(server, plan.endpoint, body(index), index=index, t0=t0, stop=stop)
            with lock:
                records.append(record)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _ordered(records, t0)


def arrivals(plan: LoadPlan, rate: float) -> list[float]:
    """When each request of an open-loop level is sent (seconds from its start)."""
    rng = random.Random(plan.seed)
    times: list[float] = []
    at = 0.0
    for i in range(plan.requests):
        at = rng.expovariate(rate) + at if plan.arrival == "poisson" else i / rate
        if at >= plan.duration_s:
            break
        times.append(at)
    return times


def open_loop(
    server: Server,
    plan: LoadPlan,
    rate: float,
    body: Body,
    *,
    stop: threading.Event | None = None,
) -> tuple[list[RequestRecord], float]:
    """Requests sent at ``arrivals``, each on a thread of its own, answered or not (none
    once ``stop`` is set)."""
    t0 = time.perf_counter()
    lock = threading.Lock()
    records: list[RequestRecord] = []
    threads: list[threading.Thread] = []

    def one(index: int) -> None:
        record = stream_one(server, plan.endpoint, body(index), index=index, t0=t0, stop=stop)
        with lock:
            records.append(record)

    for index, at in enumerate(arrivals(plan, rate)):
        if _wait(stop, max(0.0, t0 + at - time.perf_counter())):
            break
        threads = [t for t in threads if t.is_alive()]
        if len(threads) >= MAX_IN_FLIGHT:
            with lock:
                records.append(_dropped(index, time.perf_counter() - t0))
            continue
        thread = threading.Thread(target=one, args=(index,), daemon=True)
        thread.start()
        threads.append(thread)
    for t in threads:
        t.join()
    return _ordered(records, t0)


def _dropped(index: int, start_s: float) -> RequestRecord:
    return RequestRecord(
        index=index,
        start_s=start_s,
        ttft_s=None,
        e2e_s=0.0,
        itl_s=(),
        output_tokens=0,
        prompt_tokens=None,
        status=0,
        error=f"dropped: {MAX_IN_FLIGHT} requests already in flight",
    )


def _ordered(records: list[RequestRecord], t0: float) -> tuple[list[RequestRecord], float]:
    """The records by their number, and the level's length (to the last end)."""
    ends = [r.start_s + r.e2e_s for r in records]
    duration = max(ends) if ends else time.perf_counter() - t0
    return sorted(records, key=lambda r: r.index), duration


# --- energy from edgekit's /metrics ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PowerReading:
    """What edgekit's ``/metrics`` says about power at one moment."""

    t: float
    sensor: str
    measured: bool
    energy_j: float
    generation_j: float
    tokens: float


def read_power(server: Server) -> PowerReading | None:
    """The server's power figures now, or None: no ``/metrics``, or not edgekit's with a
    power meter (llama.cpp's, Ollama's, a server started without one)."""
    try:
        status, raw = get(server, "/metrics")
    except (OSError, http.client.HTTPException):
        return None
    if status != 200:
        return None
    samples = parse_metrics(raw.decode("utf-8", "replace"))
    info = [labels for name, labels, _ in samples if name == "edgekit:power_meter_info"]
    if not info:
        return None
    sensor = info[0].get("sensor", "")
    values = {(n, labels.get("sensor", "")): v for n, labels, v in samples}
    try:
        return PowerReading(
            t=time.perf_counter(),
            sensor=sensor,
            measured=info[0].get("measured") == "true",
            energy_j=values[("edgekit:energy_joules_total", sensor)],
            generation_j=values[("edgekit:generation_energy_joules_total", sensor)],
            tokens=values[("edgekit:tokens_predicted_total", "")],
        )
    except KeyError:
        return None


def energy_between(before: PowerReading, after: PowerReading | None) -> Energy | None:
    if after is None or after.sensor != before.sensor:
        return None
    tokens = int(after.tokens - before.tokens)
    joules = after.generation_j - before.generation_j
    span = after.t - before.t
    return Energy(
        sensor=clean_text(before.sensor, max_len=40),
        measured=before.measured,
        joules=joules,
        tokens=tokens,
        joules_per_token=joules / tokens if tokens > 0 else None,
        watts=(after.energy_j - before.energy_j) / span if span > 0 else None,
    )


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value); comments and
    lines that do not parse are skipped (a server's output is untrusted)."""
    out = []
    for line in text.splitlines()[:100_000]:
        m = _SAMPLE.fullmatch(line.strip())
        if m is None or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        inner = (m.group(2) or "{}")[1:-1]
        for lm in _LABEL.finditer(inner):
            labels[lm.group(1)] = re.sub(
                r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2)
            )
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out
