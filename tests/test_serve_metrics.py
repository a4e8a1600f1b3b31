"""edgekit serve's /metrics: the registry's text format (checked by a strict parser written
here), the counters against the requests a test sent, the gauges while generations run
and wait, /health's slots, power and energy per token, and the same caller checks as
every other endpoint."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from edgekit.errors import ServeError
from edgekit.power.base import MeterUnavailable, PowerMeter, Reading
from edgekit.serve_metrics import Registry, escape_label_value, format_value
from edgekit.serve_power import PowerWatch
from edgekit.serve_telemetry import ServeMetrics
from tests.serve_harness import (
    KEY,
    FakeSession,
    LiveServer,
    http_bytes,
    raw_exchange,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)
AUTH = {"Authorization": f"Bearer {KEY}"}

# --- a strict parser of the text format, written from the format's description --------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"({_NAME})(?:\{{(.*)\}})? (\S+)")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _unescape(value: str) -> str:
    return re.sub(r"\\([\\\"n])", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> tuple[dict[str, str], Series]:
    """(family -> type, series -> value); fails on anything the format does not allow."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    series: Series = {}
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name) and name not in helps, line
            helps.add(name)
            current = name
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and name not in types, line
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
            continue
        m = _SAMPLE.fullmatch(line)
        assert m is not None, f"not a sample line: {line!r}"
        name, inner, raw = m.groups()
        family = current
        assert family is not None and family in types, line
        allowed = {family}
        if types[family] == "histogram":
            allowed = {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        assert name in allowed, f"{name} outside its family {family}"
        labels: list[tuple[str, str]] = []
        rest = inner or ""
        while rest:
            pm = _PAIR.match(rest)
            assert pm is not None, f"bad labels in {line!r}"
            labels.append((pm.group(1), _unescape(pm.group(2))))
            rest = rest[pm.end() :]
        value = float(raw.replace("+Inf", "inf").replace("-Inf", "-inf"))
        key = (name, tuple(labels))
        assert key not in series, f"repeated series {key}"
        series[key] = value
    return types, series


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, tuple(labels.items())), 0.0)


def check_histograms(types: dict[str, str], series: Series) -> None:
    """Buckets cumulative, ending in +Inf, equal to _count; le strictly increasing."""
    for family, kind in types.items():
        if kind != "histogram":
            continue
        groups: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        for (name, labels), v in series.items():
            if name == f"{family}_bucket":
                rest = tuple(p for p in labels if p[0] != "le")
                le = dict(labels)["le"]
                groups.setdefault(rest, []).append((float(le.replace("+Inf", "inf")), v))
        for rest, buckets in groups.items():
            bounds = [b for b, _ in buckets]
            counts = [c for _, c in buckets]
            assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
            assert math.isinf(bounds[-1])
            assert counts == sorted(counts), f"{family} buckets are not cumulative"
            assert series[(f"{family}_count", rest)] == counts[-1]
            assert (f"{family}_sum", rest) in series


# --- the registry --------------------------------------------------------------------------


def test_registry_renders_the_text_format() -> None:
    r = Registry()
    c = r.counter("edgekit:things_total", "Things\nwith a \\ and a newline", ("kind",))
    g = r.gauge("edgekit:level", "A level")
    h = r.histogram("edgekit:wait_seconds", "Waits", (0.1, 1.0))
    c.inc(2, "a")
    c.inc(0.5, "b")
    g.set(-3.25)
    for x in (0.05, 0.1, 0.5, 5.0, math.nan):
        h.observe(x)
    text = r.render()
    types, series = parse(text)
    assert types == {
        "edgekit:things_total": "counter",
        "edgekit:level": "gauge",
        "edgekit:wait_seconds": "histogram",
    }
    assert "# HELP edgekit:things_total Things\\nwith a \\\\ and a newline\n" in text
    assert value(series, "edgekit:things_total", kind="a") == 2
    assert value(series, "edgekit:level") == -3.25
    assert [value(series, "edgekit:wait_seconds_bucket", le=le) for le in ("0.1", "1", "+Inf")] == [
        2,
        3,
        4,
    ]
    assert value(series, "edgekit:wait_seconds_sum") == pytest.approx(5.65)
    check_histograms(types, series)


def test_values_print_as_prometheus_reads_them() -> None:
    assert [format_value(v) for v in (3.0, 0.25, math.inf, -math.inf, math.nan)] == [
        "3",
        "0.25",
        "+Inf",
        "-Inf",
        "NaN",
    ]
    assert format_value(1e300) == "1e+300"


@pytest.mark.parametrize(
    "hostile",
    ['evil"} 1\nedgekit:fake 9', "back\\slash\\n", "\ud800lone", "", "ünïcode ☃", "a\r\tb"],
)
def test_hostile_label_values_stay_inside_their_quotes(hostile: str) -> None:
    r = Registry()
    r.gauge("edgekit:model_info", "the model", ("model",)).set(1, hostile)
    types, series = parse(r.render())
    assert list(series) == [
        ("edgekit:model_info", (("model", hostile.encode("utf-8", "replace").decode()),))
    ]
    assert "\n" not in escape_label_value(hostile)


def test_registry_refuses_what_the_format_cannot_carry() -> None:
    r = Registry()
    c = r.counter("edgekit:ok_total", "fine")
    for bad in (
        lambda: r.counter("0bad", "x"),
        lambda: r.gauge("edgekit:g", "x", ("le",)),
        lambda: r.gauge("edgekit:h", "x", ("__reserved",)),
        lambda: r.counter("edgekit:ok_total", "twice"),
        lambda: r.histogram("edgekit:hist", "x", (1.0, 0.5)),
        lambda: c.inc(-1),
        lambda: c.inc(math.nan),
        lambda: c.inc(1, "unexpected label"),
    ):
        with pytest.raises(ServeError) as caught:
            bad()
        assert caught.value.hint


def test_registry_is_thread_safe() -> None:
    r = Registry()
    c = r.counter("edgekit:hits_total", "hits")
    h = r.histogram("edgekit:t_seconds", "t", (0.5,))

    def hammer() -> None:
        for _ in range(2000):
            c.inc()
            h.observe(0.1)
            r.render()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value() == 8000 and h.count() == 8000


# --- the live server: counters match the requests sent ---------------------------------------


def _scrape(live: LiveServer) -> tuple[dict[str, str], Series]:
    r = httpx.get(f"http://127.0.0.1:{live.port}/metrics", headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    types, series = parse(r.text)
    check_histograms(types, series)
    return types, series


def _completion(live: LiveServer, **body: Any) -> httpx.Response:
    payload = {"model": "m", "prompt": "Hello", "max_tokens": 4, **body}
    return httpx.post(f"{live.url}/completions", json=payload, headers=AUTH, timeout=30)


def _chat_stream(live: LiveServer, max_tokens: int = 3) -> list[dict[str, Any]]:
    payload = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = []
    with httpx.stream(
        "POST", f"{live.url}/chat/completions", json=payload, headers=AUTH, timeout=30
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_counters_match_the_requests_sent() -> None:
    fake = FakeSession(token_delay=0.002)
    hostile_name = 'smol"lm\n} 2\\'
    with LiveServer(fake, model_name=hostile_name, queue_size=1) as live:
        usages = [_completion(live).json()["usage"] for _ in range(3)]  # N = 3 completions
        streams = [_chat_stream(live) for _ in range(2)]  # M = 2 streamed
        usages += [events[-1]["usage"] for events in streams]
        assert _completion(live, bogus=1).status_code == 400  # one 400
        # one 503: a slow generation holds the one place in the queue
        fake.token_delay = 0.05
        holder = threading.Thread(target=_completion, args=(live,), kwargs={"max_tokens": 40})
        holder.start()
        assert wait_until(lambda: fake.state.running == 1)
        assert _completion(live).status_code == 503
        holder.join()
        types, series = _scrape(live)
    completions = ("edgekit:requests_total", "/v1/completions")
    assert (
        value(series, completions[0], endpoint=completions[1], status="200", outcome="completed")
        == 4
    )
    assert (
        value(
            series,
            "edgekit:requests_total",
            endpoint="/v1/chat/completions",
            status="200",
            outcome="completed",
        )
        == 2
    )
    assert (
        value(series, completions[0], endpoint=completions[1], status="400", outcome="refused") == 1
    )
    assert value(series, completions[0], endpoint=completions[1], status="503", outcome="busy") == 1
    generated = sum(u["completion_tokens"] for u in usages) + 40
    prompts = sum(u["prompt_tokens"] for u in usages) + len(fake.tokenize("Hello"))
    assert value(series, "edgekit:tokens_predicted_total") == generated
    assert value(series, "edgekit:prompt_tokens_total") == prompts
    assert value(series, "edgekit:prompt_tokens_cached_total") == 0
    assert value(series, "edgekit:time_to_first_token_seconds_count") == 6
    assert value(series, "edgekit:e2e_request_latency_seconds_count") == 6
    assert value(series, "edgekit:inter_token_latency_seconds_count") == generated - 6
    assert value(series, "edgekit:finish_reasons_total", reason="length") == 6
    assert value(series, "edgekit:tokens_predicted_seconds_total") > 39 * 0.05 * 0.9
    assert value(series, "edgekit:prompt_seconds_total") > 0
    assert value(series, "edgekit:requests_processing") == 0
    assert value(series, "edgekit:requests_deferred") == 0
    assert value(series, "edgekit:slots") == 1
    assert value(series, "edgekit:model_info", model=hostile_name, target="fake") == 1
    for kind in ("counter", "gauge", "histogram"):
        assert kind in types.values()


def test_gauges_while_one_runs_and_one_waits() -> None:
    fake = FakeSession(token_delay=0.05)
    with LiveServer(fake) as live:
        threads = [
            threading.Thread(target=_completion, args=(live,), kwargs={"max_tokens": 30})
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        assert wait_until(lambda: fake.state.running == 1 and fake.waiting == 1)
        _, series = _scrape(live)
        health = httpx.get(f"http://127.0.0.1:{live.port}/health").json()
        for t in threads:
            t.join()
    assert value(series, "edgekit:requests_processing") == 1
    assert value(series, "edgekit:requests_deferred") == 1
    assert health == {"status": "ok", "slots_idle": 0, "slots_processing": 1}


def test_a_client_gone_is_counted_as_such() -> None:
    fake = FakeSession(token_delay=0.05)
    with LiveServer(fake) as live:
        body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 200, "stream": True})
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            s.sendall(http_bytes("POST", "/v1/completions", body.encode(), port=live.port))
            s.recv(200)  # the stream started
        assert wait_until(lambda: live.stats.cancelled == 1 and live.stats.open == 0, 30)
        _, series = _scrape(live)
    assert (
        value(
            series,
            "edgekit:requests_total",
            endpoint="/v1/completions",
            status="200",
            outcome="client_gone",
        )
        == 1
    )
    assert value(series, "edgekit:finish_reasons_total", reason="cancelled") <= 1
    assert value(series, "edgekit:e2e_request_latency_seconds_count") == 0


# --- /metrics answers only who may call -------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 200),
        ({"Authorization": None}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Host": "evil.example"}, 403),
        ({"Origin": "http://evil.example"}, 403),
    ],
)
def test_metrics_follows_the_caller_checks(headers: dict[str, str | None], status: int) -> None:
    with LiveServer(FakeSession()) as live:
        response = raw_exchange(
            live.port, http_bytes("GET", "/metrics", b"", headers, port=live.port)
        )
        assert status_of(response) == status
        post = raw_exchange(live.port, http_bytes("POST", "/metrics", b"{}", port=live.port))
        assert status_of(post) == 405


def test_metrics_needs_no_key_when_the_server_has_none() -> None:
    with LiveServer(FakeSession(), api_key=None) as live:
        r = httpx.get(f"http://127.0.0.1:{live.port}/metrics")
        assert r.status_code == 200 and "edgekit:requests_total" in r.text
        health = httpx.get(f"http://127.0.0.1:{live.port}/health").json()
        assert health == {"status": "ok", "slots_idle": 1, "slots_processing": 0}


# --- power --------------------------------------------------------------------------------------


class Scripted(PowerMeter):
    """Readings from a list: (t, watts) or (t, joules)."""

    def __init__(
        self, readings: list[Reading], *, name: str = "rapl", measured: bool = True
    ) -> None:
        self.readings = iter(readings)
        self.name, self.measured = name, measured

    def read(self) -> Reading:
        try:
            return next(self.readings)
        except StopIteration:
            raise MeterUnavailable("the sensor went away") from None


class Clocked(ServeMetrics):
    """Busy seconds from a script: 0 until t=10, then busy from 10 to 12."""

    def busy_seconds(self, now: float | None = None) -> float:
        assert now is not None
        return min(max(now - 10.0, 0.0), 2.0)


def test_energy_counter_meter_and_the_busy_share() -> None:
    metrics = Clocked(model="m", target="fake", slots=lambda: 1)
    meter = Scripted([Reading(t=t, joules=5.0 * t) for t in (9.0, 10.0, 11.0, 13.0)])
    watch = PowerWatch(meter, metrics)
    for _ in range(5):
        watch.tick()
    metrics.predicted.inc(20)
    types, series = parse(metrics.render())
    check_histograms(types, series)
    assert value(series, "edgekit:energy_joules_total", sensor="rapl") == pytest.approx(20.0)
    # busy 10..11 (all of 5 J), then 1 s of 11..13 (half of 10 J)
    assert value(series, "edgekit:generation_energy_joules_total", sensor="rapl") == pytest.approx(
        10.0
    )
    assert value(series, "edgekit:joules_per_token", sensor="rapl") == pytest.approx(0.5)
    assert value(series, "edgekit:power_watts", sensor="rapl") != value(
        series, "edgekit:power_watts", sensor="rapl"
    )  # NaN: the sensor was lost
    assert watch.lost == "the sensor went away"
    assert value(series, "edgekit:power_meter_info", sensor="rapl", measured="true", detail="") == 1


def test_an_estimate_is_labelled_as_one() -> None:
    metrics = ServeMetrics(model="m", target="fake", slots=lambda: 1)
    meter = Scripted(
        [Reading(t=1.0, watts=4.0), Reading(t=3.0, watts=8.0)], name="estimated", measured=False
    )
    watch = PowerWatch(meter, metrics)
    watch.tick()
    watch.tick()
    _, series = parse(metrics.render())
    assert value(series, "edgekit:energy_joules_total", sensor="estimated") == pytest.approx(12.0)
    assert value(series, "edgekit:power_watts", sensor="estimated") == 8.0
    assert (
        value(series, "edgekit:power_meter_info", sensor="estimated", measured="false", detail="")
        == 1
    )
    help_line = next(
        line for line in metrics.render().splitlines() if line.startswith("# HELP edgekit:power_w")
    )
    assert "estimate" in help_line


def test_busy_seconds_follow_the_generations() -> None:
    fake = FakeSession(token_delay=0.02)
    with LiveServer(fake) as live:
        metrics = live.app.metrics
        assert metrics.busy_seconds() == 0
        started = time.monotonic()
        _completion(live, max_tokens=10)
        took = time.monotonic() - started
        busy = metrics.busy_seconds()
    assert 0.15 < busy <= took


def test_the_watch_thread_reads_until_stopped() -> None:
    metrics = ServeMetrics(model="m", target="fake", slots=lambda: 1)

    class Steady(PowerMeter):
        name = "nvml"
        calls = 0

        def read(self) -> Reading:
            Steady.calls += 1
            return Reading(t=time.monotonic(), watts=3.0)

    with PowerWatch(Steady(), metrics, interval_s=0.02):
        assert wait_until(lambda: Steady.calls >= 5, 5)
    calls = Steady.calls
    time.sleep(0.1)
    assert Steady.calls == calls  # stopped
    assert metrics.registry.render().count("edgekit:power_watts{") == 1


def test_slots_come_from_a_batched_session() -> None:
    class Batched(FakeSession):
        parallel = 4  # what a session with continuous batching reports

    with LiveServer(Batched(), api_key=None) as live:
        health = httpx.get(f"http://127.0.0.1:{live.port}/health").json()
        _, series = _scrape(live)
    assert health["slots_idle"] == 4 and value(series, "edgekit:slots") == 4


def test_turns_follow_the_slots() -> None:
    """With two slots, the third generation's turn comes when one of the first two ends."""

    class Handle:
        state = "running"
        started = True
        prompt_tokens = 10

    metrics = ServeMetrics(model="m", target="fake", slots=lambda: 2)
    traces = [metrics.received("/v1/completions") for _ in range(3)]
    for t in traces:
        metrics.admitted(t)
        metrics.begun(t, Handle())  # type: ignore[arg-type]
    assert traces[0].turn is not None and traces[1].turn is not None and traces[2].turn is None
    metrics.ended(traces[1])
    assert traces[2].turn is not None and traces[2].turn >= traces[1].begun  # type: ignore[operator]
    assert metrics.prompt_tokens.value() == 10  # counted once its generation ended
