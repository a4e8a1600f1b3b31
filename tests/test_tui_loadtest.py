"""The TUI's Load tab, driven with Pilot against a real server on 127.0.0.1 (the load
test's fake OpenAI server, and edgekit serve on a fake session for energy per token):
its table is the library's result, formatted as `edgekit loadtest` formats it; failures
are notifications; Stop stops. Plus its look, from a recorded result."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import require
from tests.loadtest_fakes import Behaviour, FakeOpenAI
from tests.serve_harness import free_port

require("textual", "the TUI is a Textual app")

from edgekit.tui.loadtest import LoadPane  # noqa: E402
from textual.pilot import Pilot  # noqa: E402
from textual.widgets import Button, Checkbox, DataTable, Input, ProgressBar, Static  # noqa: E402

import edgekit.loadtest  # noqa: E402
from edgekit.loadtest_stats import LevelResult, LoadTestResult, Spread  # noqa: E402
from tests.test_tui import SIZE, SnapCompare, app_for, wait_for  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[LoadTestResult]:
    """What the library returned to the tab, run by run (the tab imports run_loadtest when
    it runs, so the spy is what it calls)."""
    real = edgekit.loadtest.run_loadtest
    returned: list[LoadTestResult] = []

    def spy(*args: Any, **kwargs: Any) -> LoadTestResult:
        returned.append(real(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(edgekit.loadtest, "run_loadtest", spy)
    return returned


def fill(pane: LoadPane, **values: str) -> None:
    for key, value in values.items():
        pane.query_one(f"#load-{key.replace('_', '-')}", Input).value = value


def rows(pane: LoadPane) -> list[list[str]]:
    table = pane.query_one("#load-table", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def notes(pane: LoadPane) -> str:
    return str(pane.query_one("#load-notes", Static).content)


def _ms(s: Spread) -> str:
    assert s.p50 is not None and s.p95 is not None and s.p99 is not None
    return f"{s.p50 * 1e3:.0f} / {s.p95 * 1e3:.0f} / {s.p99 * 1e3:.0f}"


def expected_row(level: LevelResult) -> list[str]:
    """The row `edgekit loadtest` prints for ``level``, written out here on its own."""
    e2e = level.e2e_s
    assert e2e.p50 is not None and e2e.p95 is not None and e2e.p99 is not None
    energy = level.energy
    joules = "-"
    if energy is not None and energy.joules_per_token is not None:
        joules = f"{energy.joules_per_token:.3f}" + ("" if energy.measured else " (est.)")
    return [
        level.label(),
        str(level.ok),
        str(level.errors),
        f"{level.requests_per_s:.2f}",
        f"{level.output_tokens_per_s:.1f}",
        _ms(level.ttft_s),
        _ms(level.itl_s),
        f"{e2e.p50:.2f} / {e2e.p95:.2f} / {e2e.p99:.2f}",
        joules,
    ]


async def start(pilot: Pilot[None], **values: str) -> LoadPane:
    """Go to the Load tab, type ``values`` into its inputs, press Start."""
    await pilot.press("l")
    pane = pilot.app.query_one(LoadPane)
    fill(pane, **values)
    await pilot.click("#load-start")
    return pane


# --- the inputs -------------------------------------------------------------------------


async def test_the_inputs_start_with_the_commands_defaults(tmp_path: Path) -> None:
    from edgekit.cli import main

    defaults = {p.name: p.default for p in main.commands["loadtest"].params}
    serve = {p.name: p.default for p in main.commands["serve"].params}
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        pane = app.query_one(LoadPane)

        def value(key: str) -> str:
            return pane.query_one(f"#load-{key}", Input).value

        assert value("url") == f"http://{serve['host']}:{serve['port']}/v1"
        assert value("requests") == str(defaults["requests"])
        assert value("prompt-tokens") == str(defaults["prompt_tokens"])
        assert value("max-tokens") == str(defaults["max_tokens"])
        # no --concurrency: the command passes no levels, and the plan makes it one client
        from edgekit.cli.loadtest_view import numbers

        plan = edgekit.loadtest.LoadPlan(url=value("url"), concurrency=numbers("-", None, int))
        assert value("concurrency") == ",".join(map(str, plan.concurrency)) == "1"
        assert not pane.query_one("#load-allow-remote", Checkbox).value
        assert pane.query_one("#load-stop", Button).disabled


def test_edgekit_tui_passes_the_url_and_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgekit.tui.app

    from edgekit.cli import main

    given: list[Any] = []
    monkeypatch.setattr(edgekit.tui.app, "run_app", lambda sources: given.append(sources))
    url = "http://127.0.0.1:8080/v1"
    result = CliRunner().invoke(main, ["tui", "--load-url", url, "--api-key", "k1"])
    assert result.exit_code == 0, result.output
    assert given[0].load_url == url and given[0].api_key == "k1"
    assert "k1" not in repr(given[0])
    monkeypatch.setenv("EDGEKIT_API_KEY", "k2")
    assert CliRunner().invoke(main, ["tui"]).exit_code == 0
    assert given[1].load_url == "http://127.0.0.1:8000/v1" and given[1].api_key == "k2"


# --- a run -------------------------------------------------------------------------------


async def test_a_run_shows_the_librarys_figures_level_by_level(
    tmp_path: Path, fake: FakeOpenAI, runs: list[LoadTestResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the rows shown when the library starts each level: level 1's before level 2 starts
    shown_at_start: list[int] = []
    real = edgekit.loadtest.run_loadtest

    def watched(plan: Any, *, progress: Callable[[str], None], **kw: Any) -> LoadTestResult:
        def seen(label: str) -> None:
            progress(label)  # returns once the tab has shown it (call_from_thread)
            shown_at_start.append(len(pane.levels))

        return real(plan, progress=seen, **kw)

    monkeypatch.setattr(edgekit.loadtest, "run_loadtest", watched)
    app = app_for(tmp_path, load_url=fake.url)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        pane = app.query_one(LoadPane)
        fill(pane, concurrency="1,2", requests="4", prompt_tokens="16", max_tokens="3")
        await pilot.click("#load-start")
        await wait_for(pilot, lambda: pane.status.startswith("done"))
        assert shown_at_start == [0, 1]
        result = pane.result
        assert result is not None
        (level_1, level_2) = result.levels
        assert level_1.ok == level_2.ok == 4 and level_1.errors == level_2.errors == 0
        assert fake.count == 1 + 8  # the warm-up, then each level's requests
        assert (result.prompt_tokens, result.max_tokens, result.requests_per_level) == (16, 3, 4)
        assert rows(pane) == [expected_row(level_1), expected_row(level_2)]
        assert pane.status == "done: 2 of 2 levels"
        assert "model fake-model" in notes(pane) and "p50 / p95 / p99" in notes(pane)
        bar = pane.query_one("#load-progress", ProgressBar)
        assert (bar.progress, bar.total) == (2, 2)
        assert not pane.query_one("#load-start", Button).disabled


async def test_energy_per_token_from_edgekit_serve(tmp_path: Path, runs: list[Any]) -> None:
    """Against edgekit serve (with an API key and a power meter): the key from `edgekit
    tui --api-key` is sent, and J/token is shown, marked as an estimate."""
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
        app = app_for(tmp_path, load_url=live.url, api_key=KEY)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("l")
            pane = app.query_one(LoadPane)
            fill(pane, requests="3", prompt_tokens="8", max_tokens="10")
            await pilot.click("#load-start")
            await wait_for(pilot, lambda: pane.status.startswith("done"))
            (level,) = runs[0].levels
            assert level.ok == 3 and level.energy is not None
            assert rows(pane) == [expected_row(level)]
            assert rows(pane)[0][-1].endswith(" (est.)")


async def test_a_hostile_model_name_is_shown_as_text(tmp_path: Path) -> None:
    hostile = "[/bold][@click=app.quit]x\x1b[2J"
    with FakeOpenAI(Behaviour(model=hostile)) as server:
        app = app_for(tmp_path, load_url=server.url)
        async with app.run_test(size=SIZE) as pilot:
            pane = await start(pilot, requests="1", max_tokens="2")
            await wait_for(pilot, lambda: pane.status.startswith("done"))
            assert "model [/bold][@click=app.quit]x?[2J" in notes(pane)
            assert app.is_running


# --- failures and Stop -------------------------------------------------------------------


async def test_nothing_listening_is_a_notification(tmp_path: Path) -> None:
    app = app_for(tmp_path, load_url=f"http://127.0.0.1:{free_port()}/v1")
    async with app.run_test(size=SIZE) as pilot:
        pane = await start(pilot)
        await wait_for(pilot, lambda: pane.status == "failed")
        note = list(app._notifications)[-1]
        assert note.severity == "error" and note.title == "load"
        assert "cannot list the models" in note.message and "hint:" in note.message
        assert "Traceback" not in note.message
        assert app.is_running and not pane.query_one("#load-start", Button).disabled


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"url": "http://203.0.113.5:8000/v1"}, "not this machine"),
        ({"url": "ftp://127.0.0.1/v1"}, "is not an http:// or https:// URL"),
        ({"requests": "lots"}, "--requests 'lots' is not a whole number"),
        ({"concurrency": "1,two"}, "--concurrency '1,two' is not a list of numbers"),
        ({"concurrency": "0"}, "--concurrency 0 is out of range"),
        ({"max_tokens": "1000000"}, "--max-tokens 1000000 is out of range"),
    ],
)
async def test_a_refused_url_or_value_is_a_notification(
    tmp_path: Path, values: dict[str, str], message: str
) -> None:
    """The library's checks, as the command makes them: nothing is sent."""
    app = app_for(tmp_path, load_url="http://127.0.0.1:9/v1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        pane = app.query_one(LoadPane)
        fill(pane, **values)
        await pilot.click("#load-start")
        await wait_for(pilot, lambda: pane.status == "failed", 10)
        note = list(app._notifications)[-1]
        assert note.severity == "error" and message in note.message
        if message == "not this machine":
            assert "--allow-remote" in note.message


async def test_allow_remote_is_passed_and_warned_about(
    tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ticked, the plan allows a remote server and the tab warns that it loads one (the
    fake stands in for it: the library is told it is not this machine)."""
    real = edgekit.loadtest.server_for
    plans: list[Any] = []

    def as_remote(plan: Any) -> Any:
        plans.append(plan)
        return real(plan)[0], False

    monkeypatch.setattr(edgekit.loadtest, "server_for", as_remote)
    app = app_for(tmp_path, load_url=fake.url)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        pane = app.query_one(LoadPane)
        fill(pane, requests="1", max_tokens="2")
        pane.query_one("#load-allow-remote", Checkbox).value = True
        await pilot.click("#load-start")
        await wait_for(pilot, lambda: pane.status.startswith("done"))
        assert plans and all(p.allow_remote for p in plans)
        warning = list(app._notifications)[0]
        assert warning.severity == "warning" and "not this machine" in warning.message


async def test_stop_ends_the_run_promptly(tmp_path: Path, fake: FakeOpenAI) -> None:
    app = app_for(tmp_path, load_url=fake.url)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        pane = app.query_one(LoadPane)
        # two clients, 4 s answers, a thousand requests: minutes unless stopped
        fill(pane, concurrency="2,4", requests="1000", max_tokens="200")
        await pilot.click("#load-start")
        await wait_for(pilot, lambda: fake.count >= 3 and pane.status.startswith("loading"))
        assert pane.query_one("#load-start", Button).disabled
        stopped_at = time.monotonic()
        await pilot.click("#load-stop")
        await wait_for(pilot, lambda: pane.status.startswith("stopped"), 10)
        assert time.monotonic() - stopped_at < 2.0
        assert pane.status == "stopped: 0 of 2 levels" and rows(pane) == []
        sent = fake.count
        await pilot.pause(0.5)
        assert fake.count == sent == 3  # nothing sent after the stop
        assert not pane.query_one("#load-start", Button).disabled
        assert pane.query_one("#load-stop", Button).disabled


# --- look ----------------------------------------------------------------------------------


def _recorded_result() -> LoadTestResult:
    """Two levels made from fixed request records (the figures of a small model)."""
    from edgekit.loadtest_client import RequestRecord
    from edgekit.loadtest_stats import Energy, summarize

    def level(clients: int, ttft: float, gap: float, failed: int) -> LevelResult:
        records = [
            RequestRecord(
                index=i,
                start_s=i * 0.5,
                ttft_s=ttft * (1 + i % 3 / 10),
                e2e_s=ttft + 15 * gap,
                itl_s=(gap,) * 15,
                output_tokens=16,
                prompt_tokens=130,
                status=200,
            )
            for i in range(8 - failed)
        ] + [
            RequestRecord(
                index=8 - failed + i,
                start_s=0.0,
                ttft_s=None,
                e2e_s=0.0,
                itl_s=(),
                output_tokens=0,
                prompt_tokens=None,
                status=503,
                error="HTTP 503: busy",
            )
            for i in range(failed)
        ]
        joules = 0.142 * clients * 16 * (8 - failed)
        energy = Energy(
            sensor="estimated",
            measured=False,
            joules=joules,
            tokens=16 * (8 - failed),
            joules_per_token=0.142 * clients,
            watts=joules / (4.0 / clients),
        )
        return summarize("concurrency", clients, records, 4.0 / clients, energy)

    return LoadTestResult(
        created="2026-01-01T00:00:00+00:00",
        edgekit_version="0",
        url="http://127.0.0.1:8000/v1",
        endpoint="completions",
        model="smollm2",
        prompt_tokens=128,
        prompt_note="",
        max_tokens=16,
        arrival="poisson",
        requests_per_level=8,
        duration_s=60.0,
        levels=(level(1, 0.23, 0.011, 0), level(2, 0.9, 0.02, 1)),
    )


@pytest.mark.usefixtures("_repo_root")
def test_look_of_the_load_tab_with_a_recorded_result(snap_compare: SnapCompare) -> None:
    from tests.test_tui import _at, _snapshot_app

    async def run(pilot: Pilot[None]) -> None:
        await _at("load")(pilot)
        for widget in pilot.app.query(Input):
            widget.cursor_blink = False
        pane = pilot.app.query_one(LoadPane)
        result = _recorded_result()
        pane.begin(len(result.levels))
        for level in result.levels:
            pane.level_done(level)
        pane.finished(result)
        await pilot.pause(0.3)

    assert snap_compare(_snapshot_app(), terminal_size=SIZE, run_before=run)


@pytest.fixture
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parent.parent)
