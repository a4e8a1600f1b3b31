"""edgekit loadtest: against a fake OpenAI server on 127.0.0.1 that records, on its own
clock, when it received each request and sent each token; against edgekit serve itself
(energy per token from its /metrics); the CLI; the refusals; a hostile server."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.errors import ServeError
from edgekit.loadtest import LoadPlan, arrivals, parse_metrics, run_loadtest, server_for
from edgekit.loadtest_stats import percentile, summarize
from edgekit.serve_metrics import Registry

pytestmark = pytest.mark.timeout(120)

TTFT = (0.03, 0.05, 0.07, 0.09, 0.11)  # the fake's delay before the first token, by index
GAP = 0.02  # between two tokens


@dataclass
class Sent:
    """What the fake did for one request, on its own clock (time.perf_counter)."""

    index: int
    received: float
    token_times: list[float] = field(default_factory=list)


@dataclass
class Behaviour:
    busy_every: int = 0  # answer every n-th request with 503 (0: never)
    fail_at_token: int | None = None  # send an error event instead of this token
    huge_line: bool = False
    not_json: bool = False
    models_status: int = 200


class FakeOpenAI:
    """A streaming OpenAI-compatible server on 127.0.0.1 (HTTP/1.0: the stream ends when
    the connection closes, as a small server's does)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.sent: dict[int, Sent] = {}
        self.lock = threading.Lock()
        self.count = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.get(self)

            def do_POST(self) -> None:
                fake.post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def get(self, h: BaseHTTPRequestHandler) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "fake-model"}]}).encode()
        h.send_response(self.behaviour.models_status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def post(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers["Content-Length"]))
        received = time.perf_counter()
        body = json.loads(raw)
        chat = h.path.endswith("/chat/completions")
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        index = int(prompt.split(".", 1)[0])
        with self.lock:
            self.count += 1
            n = self.count
        b = self.behaviour
        if b.busy_every and n % b.busy_every == 0:
            data = json.dumps({"error": {"message": "busy", "code": 503}}).encode()
            h.send_response(503)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        sent = Sent(index=index, received=received)
        if index >= 0:
            with self.lock:
                self.sent[index] = sent
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        tokens = body["max_tokens"]
        time.sleep(TTFT[index % len(TTFT)] if index >= 0 else 0.0)
        for i in range(tokens):
            if i:
                time.sleep(GAP)
            if b.fail_at_token == i:
                self._event(h, {"error": {"message": "the runtime failed", "code": 500}})
                return
            if b.huge_line:
                h.wfile.write(b"data: " + b"x" * (2 << 20) + b"\n\n")
                return
            if b.not_json:
                h.wfile.write(b"data: {not json\n\n")
                return
            delta = {"delta": {"content": "w"}} if chat else {"text": "w"}
            sent.token_times.append(time.perf_counter())  # as its first byte leaves
            self._event(h, {"choices": [{"index": 0, **delta, "finish_reason": None}]})
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
        self._event(h, {"choices": [], "usage": usage})
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()

    @staticmethod
    def _event(h: BaseHTTPRequestHandler, payload: dict[str, Any]) -> None:
        h.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        h.wfile.flush()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def _plan(url: str, **kw: Any) -> LoadPlan:
    kw.setdefault("max_tokens", 5)
    kw.setdefault("prompt_tokens", 16)
    kw.setdefault("requests", 10)
    return LoadPlan(url=url, **kw)


# --- the figures agree with the server's own clock -----------------------------------------


def test_percentiles_agree_with_the_servers_timestamps(fake: FakeOpenAI) -> None:
    sweep = run_loadtest(_plan(fake.url, concurrency=(1, 2)))
    assert [lv.label() for lv in sweep.levels] == ["1 client", "2 clients"]
    assert sweep.model == "fake-model"  # the first the server lists
    # one level a run, each checked before the next: the fake files what it sent under
    # the prompt's index, which every level numbers from 0 again
    levels = []
    for concurrency in (1, 2):
        (level,) = run_loadtest(_plan(fake.url, concurrency=(concurrency,))).levels
        levels.append(level)
        assert level.ok == level.requests == 10 and level.errors == 0
        tool_ttft, server_ttft, tool_itl, server_itl = [], [], [], []
        for r in level.records:
            s = fake.sent[r.index]
            assert r.ttft_s is not None and r.output_tokens == 5 and r.prompt_tokens == 15
            theirs = s.token_times[0] - s.received
            # the tool's clock starts before connecting, the server's once the body is in
            assert 0 <= r.ttft_s - theirs < 0.05, (r.ttft_s, theirs)
            tool_ttft.append(r.ttft_s)
            server_ttft.append(theirs)
            tool_itl += r.itl_s
            server_itl += [b - a for a, b in zip(s.token_times, s.token_times[1:], strict=False)]
        # the summary is the percentiles of the records, computed independently
        expected = statistics.quantiles(tool_ttft, n=100, method="inclusive")
        assert level.ttft_s.p50 == pytest.approx(statistics.median(tool_ttft))
        assert level.ttft_s.p95 == pytest.approx(expected[94])
        assert level.ttft_s.p99 == pytest.approx(expected[98])
        assert level.itl_s.n == 4 * 10
        # and they agree with the server's clock within loopback's latency
        for q in (50, 95, 99):
            assert 0 <= percentile(tool_ttft, q) - percentile(server_ttft, q) < 0.05
            assert abs(percentile(tool_itl, q) - percentile(server_itl, q)) < 0.02
        assert level.itl_s.p50 == pytest.approx(GAP, abs=0.015)
        # throughput: what was generated over the level's wall time
        assert level.output_tokens_per_s == pytest.approx(50 / level.duration_s)
        assert level.requests_per_s == pytest.approx(10 / level.duration_s)
    one, two = levels
    assert two.duration_s < one.duration_s  # two clients at once: the fake serves both


def test_percentile_interpolates_linearly() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    data = [0.3, 0.1, 0.9, 0.4, 0.7, 0.2]
    cuts = statistics.quantiles(data, n=100, method="inclusive")
    assert percentile(data, 95) == pytest.approx(cuts[94])
    assert summarize("concurrency", 1, [], 1.0).ttft_s.p50 is None


def test_chat_endpoint_streams_too(fake: FakeOpenAI) -> None:
    result = run_loadtest(_plan(fake.url, endpoint="chat", requests=3))
    assert result.levels[0].ok == 3 and result.levels[0].output_tokens_mean == 5


def test_open_loop_fixed_interval_sends_on_time(fake: FakeOpenAI) -> None:
    result = run_loadtest(_plan(fake.url, rates=(20.0,), arrival="fixed", requests=6))
    level = result.levels[0]
    assert level.mode == "rate" and level.label() == "20/s" and level.ok == 6
    for r in level.records:
        assert r.start_s == pytest.approx(r.index / 20, abs=0.03)


def test_poisson_arrivals_are_seeded_and_bounded() -> None:
    plan = _plan("http://127.0.0.1:1", rates=(4.0,), requests=400, duration_s=1000)
    times = arrivals(plan, 4.0)
    assert times == arrivals(plan, 4.0) and len(times) == 400
    assert times == sorted(times)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.2)
    other = LoadPlan(url="http://127.0.0.1:1", rates=(4.0,), seed=1)
    assert arrivals(other, 4.0) != arrivals(_plan("http://127.0.0.1:1", rates=(4.0,)), 4.0)
    short = _plan("http://127.0.0.1:1", rates=(4.0,), requests=400, duration_s=2.0)
    assert all(t < 2.0 for t in arrivals(short, 4.0))


def test_duration_bounds_a_level(fake: FakeOpenAI) -> None:
    started = time.monotonic()
    result = run_loadtest(_plan(fake.url, requests=1000, duration_s=0.4, max_tokens=10))
    level = result.levels[0]
    assert 1 <= level.requests <= 3  # each takes about 0.2-0.3 s
    assert time.monotonic() - started < 10


# --- errors are counted, never raised -------------------------------------------------------


def test_errors_are_counted_by_kind() -> None:
    with FakeOpenAI(Behaviour(busy_every=3)) as server:
        level = run_loadtest(_plan(server.url, requests=8, warmup=0)).levels[0]
    assert level.requests == 8 and level.errors == 2 and level.ok == 6
    assert level.error_kinds == {"HTTP 503": 2}
    assert all(r.status == 503 for r in level.records if not r.ok)


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        (Behaviour(fail_at_token=2), "error event: the runtime failed"),
        (Behaviour(huge_line=True), "an event line over"),
        (Behaviour(not_json=True), "an event that is not JSON"),
    ],
)
def test_a_hostile_or_failing_stream_is_an_error(behaviour: Behaviour, message: str) -> None:
    with FakeOpenAI(behaviour) as server:
        level = run_loadtest(_plan(server.url, requests=2, warmup=0)).levels[0]
    assert level.errors == 2
    assert all(r.error is not None and r.error.startswith(message) for r in level.records)


def test_warmup_failure_is_an_edgekit_error() -> None:
    with pytest.raises(ServeError, match="warm-up") as caught:
        run_loadtest(_plan("http://127.0.0.1:9/v1", model="m", timeout_s=5))
    assert caught.value.hint


def test_a_server_that_lists_no_model_needs_model() -> None:
    with FakeOpenAI(Behaviour(models_status=401)) as server:
        with pytest.raises(ServeError, match="HTTP 401") as caught:
            run_loadtest(_plan(server.url))
        assert "--api-key" in caught.value.hint
        assert run_loadtest(_plan(server.url, model="x", requests=1)).levels[0].ok == 1


# --- loopback only, unless asked -------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://10.0.0.7:8000/v1", "http://example.com/v1", "https://192.168.1.2"]
)
def test_a_remote_server_is_refused_unless_allowed(url: str) -> None:
    with pytest.raises(ServeError, match="not this machine") as caught:
        server_for(LoadPlan(url=url))
    assert "--allow-remote" in caught.value.hint
    server, local = server_for(LoadPlan(url=url, allow_remote=True))
    assert not local and server.base_path.startswith("/v1")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://localhost:8000/v1", "http://[::1]:8000"]
)
def test_loopback_is_allowed(url: str) -> None:
    server, local = server_for(LoadPlan(url=url))
    assert local and server.base_path == "/v1" and server.port == 8000


@pytest.mark.parametrize(
    "kw",
    [
        {"url": "ftp://127.0.0.1/v1"},
        {"url": "http://127.0.0.1:99999"},
        {"url": "http://127.0.0.1", "concurrency": (0,)},
        {"url": "http://127.0.0.1", "rates": (float("nan"),)},
        {"url": "http://127.0.0.1", "requests": 0},
        {"url": "http://127.0.0.1", "duration_s": -1.0},
    ],
)
def test_bad_plans_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ServeError):
        server_for(LoadPlan(**kw))


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_json_and_output_file(fake: FakeOpenAI, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    result = CliRunner().invoke(
        main,
        [
            "loadtest",
            fake.url,
            "--concurrency",
            "1,2",
            "--requests",
            "4",
            "--max-tokens",
            "3",
            "--json",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["endpoint"] == "completions"
    assert [lv["value"] for lv in data["levels"]] == [1, 2]
    level = data["levels"][0]
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        assert set(level[key]) == {"n", "mean", "p50", "p95", "p99", "max"}
    assert len(level["records"]) == 4 and level["energy"] is None


def test_cli_table(fake: FakeOpenAI) -> None:
    result = CliRunner().invoke(
        main, ["loadtest", fake.url, "--rate", "10", "--requests", "3", "--max-tokens", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "10/s" in result.stdout and "TTFT ms" in result.stdout


def test_cli_refuses_remote_with_error_and_hint() -> None:
    result = CliRunner().invoke(main, ["loadtest", "http://203.0.113.5:8000/v1"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and any(line.startswith("hint:") for line in lines)
    bad = CliRunner().invoke(main, ["loadtest", "http://127.0.0.1:1", "--rate", "1,fast"])
    assert bad.exit_code == 1 and "is not a list of numbers" in bad.stderr


# --- energy per token from edgekit serve's /metrics -----------------------------------------


def test_energy_per_token_from_edgekit_metrics() -> None:
    from edgekit.power.base import PowerMeter, Reading
    from edgekit.serve_power import PowerWatch
    from tests.serve_harness import KEY, FakeSession, LiveServer

    class Steady(PowerMeter):
        name = "estimated"
        measured = False

        def read(self) -> Reading:
            return Reading(t=time.monotonic(), watts=12.0)

    with (
        LiveServer(FakeSession(token_delay=0.01)) as live,
        PowerWatch(Steady(), live.app.metrics, interval_s=0.1),
    ):
        result = run_loadtest(
            _plan(live.url, api_key=KEY, requests=4, max_tokens=10, prompt_tokens=8)
        )
    level = result.levels[0]
    assert level.ok == 4 and level.energy is not None
    energy = level.energy
    assert energy.sensor == "estimated" and energy.measured is False
    assert energy.tokens == sum(r.output_tokens for r in level.records) == 40
    busy = sum(r.e2e_s for r in level.records)  # one at a time: generation time, about
    assert energy.joules == pytest.approx(12.0 * busy, rel=0.35)
    assert energy.joules_per_token == pytest.approx(energy.joules / 40)
    assert energy.watts == pytest.approx(12.0, rel=0.1)


def test_metrics_parser_reads_escaped_labels() -> None:
    r = Registry()
    g = r.gauge("edgekit:model_info", "x", ("model",))
    hostile = 'a"b\\c\nd} e="f"'
    g.set(1, hostile)
    samples = parse_metrics(r.render())
    assert samples == [("edgekit:model_info", {"model": hostile}, 1.0)]
