"""edgekit loadtest: against a fake OpenAI server on 127.0.0.1 that records, on its own
clock, when it received each request and sent each token; against edgekit serve itself
(energy per token from its /metrics); the CLI; the refusals; a hostile server."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.errors import ServeError
from edgekit.loadtest import LoadPlan, arrivals, parse_metrics, run_loadtest, server_for
from edgekit.loadtest_stats import percentile, summarize
from edgekit.serve_metrics import Registry
from tests.loadtest_fakes import GAP, Behaviour, FakeOpenAI

pytestmark = pytest.mark.timeout(120)


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


# --- progress and stopping (what the TUI's Load tab drives) ----------------------------------


def test_each_level_is_reported_as_it_ends(fake: FakeOpenAI) -> None:
    seen: list[Any] = []
    result = run_loadtest(
        _plan(fake.url, concurrency=(1, 2), requests=3),
        progress=lambda label: seen.append(label),
        level_done=lambda level: seen.append(level),
    )
    assert seen == ["1 clients at once", result.levels[0], "2 clients at once", result.levels[1]]


def test_stop_cuts_a_stream_at_its_next_line(fake: FakeOpenAI) -> None:
    from edgekit.loadtest_client import STOPPED, Server, request_body, stream_one

    server = Server.from_url(fake.url, api_key=None, timeout_s=30)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    body = request_body("completions", "m", "0. the time", 200, seed=0)  # 200 tokens: 4 s
    record = stream_one(server, "completions", body, index=0, t0=time.perf_counter(), stop=stop)
    assert record.error == STOPPED and 0 < record.output_tokens < 200
    assert record.e2e_s < 1.0


def test_stop_ends_a_closed_loop_run_at_once(fake: FakeOpenAI) -> None:
    """Two clients streaming 4 s answers: stopped, the run returns within a few tokens,
    sends nothing more, and leaves out the level it cut short."""
    stop = threading.Event()
    out: list[Any] = []
    plan = _plan(fake.url, concurrency=(2, 4), requests=1000, max_tokens=200)
    runner = threading.Thread(target=lambda: out.append(run_loadtest(plan, stop=stop)))
    runner.start()
    end = time.monotonic() + 30
    while fake.count < 3 and time.monotonic() < end:  # the warm-up, then both clients
        time.sleep(0.02)
    time.sleep(0.2)
    stopped_at = time.monotonic()
    stop.set()
    runner.join(10)
    assert not runner.is_alive() and time.monotonic() - stopped_at < 1.0
    assert out[0].levels == ()
    sent = fake.count
    time.sleep(0.3)
    assert fake.count == sent == 3


def test_stop_between_levels_keeps_the_levels_that_ended(fake: FakeOpenAI) -> None:
    stop = threading.Event()
    started: list[str] = []
    result = run_loadtest(
        _plan(fake.url, concurrency=(1, 2, 4), requests=2),
        progress=started.append,
        level_done=lambda level: stop.set(),
        stop=stop,
    )
    assert [lv.label() for lv in result.levels] == ["1 client"] and len(started) == 1
    assert result.levels[0].ok == 2


def test_stop_ends_an_open_loop_run_and_a_warm_up(fake: FakeOpenAI) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    plan = _plan(fake.url, rates=(2.0,), arrival="fixed", requests=100, warmup=0)
    assert run_loadtest(plan, stop=stop).levels == ()  # 50 s of arrivals, stopped
    assert time.monotonic() - started < 1.5 and fake.count <= 2
    # set before the start: the models are listed, nothing is sent, nothing is raised
    assert run_loadtest(_plan(fake.url), stop=stop).levels == ()
    assert fake.count <= 2


def test_stop_while_the_power_reading_settles_keeps_the_level_without_energy(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request of the level ended before Stop: the level stands, only its energy
    (read after the settle) is left out."""
    import edgekit.loadtest as lt

    reading = lt.PowerReading(
        t=0.0, sensor="rapl", measured=True, energy_j=0.0, generation_j=0.0, tokens=0.0
    )
    monkeypatch.setattr(lt, "read_power", lambda server: reading)
    stop = threading.Event()
    real_loop = lt.closed_loop

    def then_stop(*a: Any, **k: Any) -> Any:
        out = real_loop(*a, **k)
        threading.Timer(0.1, stop.set).start()  # during the settle wait that follows
        return out

    monkeypatch.setattr(lt, "closed_loop", then_stop)
    started = time.monotonic()
    result = run_loadtest(_plan(fake.url, concurrency=(1, 2), requests=2), stop=stop)
    assert time.monotonic() - started < lt.SETTLE_S  # the settle was cut short
    assert [lv.label() for lv in result.levels] == ["1 client"]
    assert result.levels[0].ok == 2 and result.levels[0].energy is None
