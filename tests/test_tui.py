"""The TUI's behaviour, tab by tab, driven with Textual's Pilot; its look as snapshots;
and one run of the real app in a real terminal (tmux)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.tui_fakes import RESULTS, FakeClock, FakeSession, recorded_probe, write_result

require("textual", "the TUI is a Textual app")

from edgekit.tui.app import EdgekitApp  # noqa: E402
from edgekit.tui.sources import Sources  # noqa: E402
from textual.pilot import Pilot  # noqa: E402
from textual.widgets import DataTable, Input, Static, TabbedContent  # noqa: E402

SIZE = (120, 40)
# The async tests run on anyio's pytest plugin (anyio is in the dev extra); the asyncio
# backend is what Textual runs on.
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MISTRAL = Path(__file__).parent.parent / "samples" / "configs" / "mistral-7b"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("torch", "the tiny model is built with torch")
    require("llama_cpp", "the bundle runs on llama.cpp")
    from edgekit.bundle import VariantRequest, pack
    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("tui")
    hf = build_tiny_model("llama", root / "hf")
    pack(hf, root / "bundle", [VariantRequest(quant="Q8_0")])
    return root / "bundle"


def app_for(tmp_path: Path, **kwargs: Any) -> EdgekitApp:
    kwargs.setdefault("probe", recorded_probe)
    kwargs.setdefault("results", tmp_path / "results")
    kwargs.setdefault("model", MISTRAL)
    kwargs.setdefault("device", "galaxy-s25-ultra")
    return EdgekitApp(Sources(**kwargs))


async def wait_for(pilot: Pilot[None], check: Callable[[], bool], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the TUI")
        await pilot.pause(0.1)


def text(app: EdgekitApp, selector: str) -> str:
    return str(app.query_one(selector, Static).content)


# --- Device ----------------------------------------------------------------------------


async def test_device_tab_shows_the_probe_and_sets_the_plan_device(tmp_path: Path) -> None:
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "Ryzen 7 7730U" in text(app, "#host-summary"))
        summary = text(app, "#host-summary")
        assert "16.0 GiB total" in summary and "(estimated)" in summary
        sensors = app.query_one("#sensors", DataTable)
        # cells that hold names are Text (never read as markup): compare what they show
        rows = [[str(c) for c in sensors.get_row_at(i)] for i in range(sensors.row_count)]
        assert ["battery", "measured", "/sys/class/power_supply/BAT0"] in rows
        assert ["rapl", "unavailable", "no powercap RAPL zones"] in rows
        # choosing another device re-plans for it
        app.query_one("#device-select").value = "jetson-orin-nano-super"  # type: ignore[attr-defined]
        await wait_for(pilot, lambda: "Jetson Orin Nano" in text(app, "#plan-summary"))
        assert app.sources.device == "jetson-orin-nano-super"


async def test_a_slow_plan_for_the_previous_device_never_lands_over_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread worker cannot be stopped: the first plan (the Galaxy) is held until the
    Jetson's has shown, then let finish; what it found must be dropped. (CI, under load,
    once showed the Galaxy's late plan over the Jetson's.)"""
    import edgekit.tui.plan as plan_tab

    real = plan_tab.resolve_device
    started, release = threading.Event(), threading.Event()

    def slow_for_the_galaxy(device: str) -> Any:
        if device == "galaxy-s25-ultra":
            started.set()
            release.wait(60)
        return real(device)

    monkeypatch.setattr(plan_tab, "resolve_device", slow_for_the_galaxy)
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, started.is_set)
        app.query_one("#device-select").value = "jetson-orin-nano-super"  # type: ignore[attr-defined]
        await wait_for(pilot, lambda: "Jetson Orin Nano" in text(app, "#plan-summary"))
        release.set()
        await wait_for(pilot, lambda: all(w.is_finished for w in app.workers if w.group == "plan"))
        await pilot.pause(0.2)
        assert "Jetson Orin Nano" in text(app, "#plan-summary")
        assert "Galaxy" not in text(app, "#plan-summary")


async def test_a_failing_probe_becomes_a_notification(tmp_path: Path) -> None:
    from edgekit.errors import ProbeError

    def broken() -> Any:
        raise ProbeError("cannot read /proc", hint="run on Linux")

    app = app_for(tmp_path, probe=broken)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(app._notifications))
        note = list(app._notifications)[0]
        assert note.severity == "error" and "hint: run on Linux" in note.message


# --- Plan ------------------------------------------------------------------------------


async def test_plan_follows_the_budgets(tmp_path: Path) -> None:
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        assert app.query_one(TabbedContent).active == "plan"
        await wait_for(pilot, lambda: "pick llamacpp Q4_K_M" in text(app, "#plan-summary"))
        table = app.query_one("#candidates", DataTable)
        assert table.row_count >= 10
        reasons = [table.get_row_at(i)[-1] for i in range(table.row_count)]
        assert any("the phone lets an app use" in str(r) for r in reasons)
        memory = app.query_one("#budget-memory", Input)
        memory.focus()
        await pilot.press(*"4GiB")
        await wait_for(pilot, lambda: "pick llamacpp Q3_K_M" in text(app, "#plan-summary"))
        # letters typed into a budget are text, not tab switches
        assert app.query_one(TabbedContent).active == "plan"
        memory.value = "lots"
        await wait_for(pilot, lambda: "not a memory size" in text(app, "#plan-summary"))
        min_tps = app.query_one("#budget-min-tps", Input)
        memory.value = ""
        min_tps.value = "50"
        await wait_for(pilot, lambda: "nothing fits" in text(app, "#plan-summary"))


# --- Bench -----------------------------------------------------------------------------


async def test_bench_runs_live_and_saves_for_compare(tmp_path: Path, tiny_bundle: Path) -> None:
    from edgekit.tui.bench import BenchPane
    from edgekit.tui.compare import ComparePane

    app = app_for(tmp_path, bundle=tiny_bundle)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("b")
        pane = app.query_one(BenchPane)
        assert "gguf-q8_0" in text(app, "#bench-bundle")
        await pilot.press("r")
        await wait_for(pilot, lambda: pane.stats.get("status", "").startswith("done"), 120)
        assert pane.decode and pane.watts  # the live series filled while it ran
        assert "tok/s" in pane.stats["decode"] and "TTFT" in pane.stats
        assert "(estimated)" in pane.stats["power"]
        saved = list((tmp_path / "results").glob("*.json"))
        assert len(saved) == 1
        assert app.query_one(ComparePane).results[0][0] == saved[0]


async def test_bench_stops_when_asked(
    tmp_path: Path, tiny_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.tui import bench as bench_tab

    # long enough to be stopped half way (the tiny model finishes the usual one in ~1 s)
    monkeypatch.setattr(bench_tab, "BENCH_SETTINGS", {"gen_tokens": 900, "repeats": 50})
    app = app_for(tmp_path, bundle=tiny_bundle)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(bench_tab.BenchPane)
        await pilot.press("r")
        await wait_for(pilot, lambda: pane.stats.get("step") == "decode", 60)
        await pilot.press("s")
        await wait_for(pilot, lambda: "status" in pane.stats, 60)
        assert pane.stats["status"] == "stopped"
        assert not list((tmp_path / "results").glob("*.json"))


async def test_bench_without_a_bundle_explains_and_a_bad_bundle_notifies(tmp_path: Path) -> None:
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("b")
        assert "No bundle" in text(app, "#bench-bundle")
        await pilot.press("r")
        await wait_for(pilot, lambda: bool(app._notifications))
        assert "pack one first" in list(app._notifications)[-1].message
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{}")
    app = app_for(tmp_path, bundle=bad)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(app._notifications))
        note = list(app._notifications)[0]
        assert note.severity == "error" and "hint:" in note.message


async def test_a_bench_that_fails_with_any_error_is_a_notification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an edgekit error: a bug, a runtime's own exception. The tab says "failed", the
    app keeps running, and a second run can start."""
    from edgekit.tui.bench import BenchPane

    import edgekit.bench

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the meter broke")

    monkeypatch.setattr(edgekit.bench, "bench", broken)
    app = app_for(tmp_path, bundle=tmp_path / "some.bundle")
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(BenchPane)
        await pilot.press("b", "r")
        await wait_for(pilot, lambda: pane.stats.get("status") == "failed")
        note = list(app._notifications)[-1]
        assert note.severity == "error" and "RuntimeError: the meter broke" in note.message
        assert app.is_running and not pane._benchmarking
        await pilot.press("r")  # the tab is ready again
        await wait_for(pilot, lambda: len(app._notifications) >= 3)
        assert app.is_running


# --- Compare ---------------------------------------------------------------------------


async def test_compare_sets_marked_results_side_by_side(tmp_path: Path) -> None:
    from edgekit.tui.compare import ComparePane

    folder = tmp_path / "results"
    folder.mkdir()
    write_result(folder, "a.json", variant="gguf-q4_k_m", decode=95.0, rss=370.0)
    write_result(folder, "b.json", variant="openvino-int4", decode=96.0, rss=460.0)
    write_result(folder, "c.json", variant="openvino-int8", decode=68.0, rss=540.0)
    (folder / "notes.json").write_text(json.dumps({"not": "a result"}))
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        pane = app.query_one(ComparePane)
        assert len(pane.results) == 3 and "1 other JSON files skipped" in text(
            app, "#compare-folder"
        )
        table = app.query_one("#compare-table", DataTable)
        assert len(table.columns) == 4  # the figure column and the three results
        files = app.query_one("#compare-files", DataTable)
        files.focus()
        await pilot.press("space", "down", "down", "space")
        assert {p.name for p in pane.marked} == {"a.json", "c.json"}
        assert len(table.columns) == 3
        row = table.get_row_at(0)
        assert list(row) == ["decode tok/s", "95.0", "68.0"]


# --- Chat ------------------------------------------------------------------------------


async def test_chat_streams_with_tokens_per_second(tmp_path: Path) -> None:
    from edgekit.tui.chat import ChatPane

    app = app_for(tmp_path, bundle=tmp_path / "some.bundle", clock=FakeClock())
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ChatPane)
        pane.session = FakeSession()
        await pilot.press("h")
        assert app.focused is app.query_one("#chat-input")
        await pilot.press(*"Capital of France?", "enter")
        await wait_for(pilot, lambda: not pane._generating and bool(pane.messages[1:]))
        assert pane.messages[-1] == {"role": "assistant", "content": FakeSession.REPLY}
        # 6 tokens, one per 20 ms tick after the first: 50 tok/s
        assert "6 tokens, 50.0 tok/s (stop)" in text(app, "#chat-reply")


async def test_a_reply_that_fails_with_any_error_is_a_notification(tmp_path: Path) -> None:
    """The session raises a RuntimeError mid-reply (not an edgekit error): it is shown as a
    notification, the app keeps running, and the next message is answered."""
    from edgekit.tui.chat import ChatPane

    app = app_for(tmp_path, bundle=tmp_path / "some.bundle", clock=FakeClock())
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ChatPane)
        pane.session = FakeSession(fail=RuntimeError("the runtime broke"))
        await pilot.press("h", *"hello", "enter")
        await wait_for(pilot, lambda: bool(app._notifications) and not pane._generating)
        note = list(app._notifications)[-1]
        assert note.severity == "error" and "RuntimeError: the runtime broke" in note.message
        assert app.is_running
        pane.session = FakeSession()
        await pilot.press(*"again", "enter")
        await wait_for(pilot, lambda: not pane._generating and len(pane.messages) >= 3)
        assert pane.messages[-1] == {"role": "assistant", "content": FakeSession.REPLY}


async def test_escape_cancels_the_reply_being_generated(tmp_path: Path) -> None:
    from edgekit.tui.chat import ChatPane

    app = app_for(tmp_path, bundle=tmp_path / "some.bundle", clock=FakeClock())
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ChatPane)
        session = FakeSession()
        pane.session = session
        await pilot.press("h")
        pane._generating = True  # as while a reply streams
        pane._generation = session.chat_stream([])
        await pilot.press("escape")
        assert session.generations[-1].cancelled  # its own generation, not the session's
        assert list(session.generations[-1])[-1].finish_reason == "cancelled"


async def test_chat_with_a_real_bundle(tmp_path: Path, tiny_bundle: Path) -> None:
    from edgekit.tui.chat import ChatPane

    app = app_for(tmp_path, bundle=tiny_bundle)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ChatPane)
        await pilot.press("h", *"hello", "enter")
        await wait_for(pilot, lambda: not pane._generating and len(pane.messages) == 2, 60)
        assert pane.session is not None and pane.session.info.target == "llamacpp"
        assert "tok/s" in text(app, "#chat-reply")


# --- Look ------------------------------------------------------------------------------

SnapCompare = Callable[..., bool]


def _at(tab: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    async def go(pilot: Pilot[None]) -> None:
        app = pilot.app
        app.query_one(TabbedContent).active = tab
        await pilot.pause(0.5)
        for _ in range(100):  # let workers finish (probe, plan)
            if not any(w.is_running for w in app.workers):
                break
            await pilot.pause(0.1)
        await pilot.pause(0.3)

    return go


def _snapshot_app(**kwargs: Any) -> EdgekitApp:
    kwargs.setdefault("probe", recorded_probe)
    kwargs.setdefault("results", Path("tests/data/bench-results"))
    kwargs.setdefault("model", Path("samples/configs/mistral-7b"))
    kwargs.setdefault("device", "galaxy-s25-ultra")
    return EdgekitApp(Sources(**kwargs))


@pytest.fixture
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parent.parent)


@pytest.mark.usefixtures("_repo_root")
@pytest.mark.parametrize("tab", ["device", "plan", "compare"])
def test_look_of_each_tab(snap_compare: SnapCompare, tab: str) -> None:
    assert snap_compare(_snapshot_app(), terminal_size=SIZE, run_before=_at(tab))


@pytest.mark.usefixtures("_repo_root")
def test_look_of_the_bench_tab_with_recorded_samples(snap_compare: SnapCompare) -> None:
    from edgekit.tui.bench import BenchPane

    from edgekit.bench import LiveSample

    async def run(pilot: Pilot[None]) -> None:
        await _at("bench")(pilot)
        pane = pilot.app.query_one(BenchPane)
        for i in range(40):
            pane.on_live(
                LiveSample(
                    t=1 + i * 0.25,
                    phase="decode",
                    tok_s=90 + (i % 7),
                    watts=11.5 + (i % 3) * 0.2,
                    watts_measured=False,
                    rss_mb=372.0,
                    ttft_s=1.28 if i == 0 else None,
                )
            )
        await pilot.pause(0.3)

    assert snap_compare(_snapshot_app(), terminal_size=SIZE, run_before=run)


@pytest.mark.usefixtures("_repo_root")
def test_look_of_the_chat_tab(snap_compare: SnapCompare) -> None:
    from edgekit.tui.chat import ChatPane

    app = _snapshot_app(bundle=Path("bundles/smollm2"), clock=FakeClock())

    async def run(pilot: Pilot[None]) -> None:
        pilot.app.query_one(ChatPane).session = FakeSession()
        # a blinking cursor would make the picture depend on the moment it is taken
        pilot.app.query_one("#chat-input", Input).cursor_blink = False
        await _at("chat")(pilot)
        await pilot.press(*"What is the capital of France?", "enter")
        pane = pilot.app.query_one(ChatPane)
        await wait_for(pilot, lambda: not pane._generating and len(pane.messages) == 2)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SIZE, run_before=run)


# --- A real terminal -------------------------------------------------------------------


def test_the_real_app_in_tmux(tmp_path: Path) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed: the real-terminal test needs it")
    session = f"edgekit-{tmp_path.name}"
    command = (
        f"{sys.executable} -m edgekit tui {MISTRAL} --device galaxy-s25-ultra --results {RESULTS}"
    )
    env = f"EDGEKIT_CACHE={tmp_path / 'cache'} TERM=xterm-256color"
    subprocess.run(
        [tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", f"env {env} {command}"],
        check=True,
    )

    def screen() -> str:
        return subprocess.run(
            [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
        ).stdout

    def wait(needle: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            shown = screen()
            if needle in shown:
                return shown
            time.sleep(0.3)
        raise AssertionError(f"{needle!r} never appeared; the screen:\n{screen()}")

    try:
        first = wait("Power envelope")
        assert "Device" in first and "Compare" in first
        subprocess.run([tmux, "send-keys", "-t", session, "p"], check=True)
        plan = wait("pick llamacpp Q4_K_M")
        assert "why not" in plan
        subprocess.run([tmux, "send-keys", "-t", session, "c"], check=True)
        assert "openvino-int8" in wait("results in")
        subprocess.run([tmux, "send-keys", "-t", session, "q"], check=True)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            alive = subprocess.run([tmux, "has-session", "-t", session], capture_output=True)
            if alive.returncode != 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("q did not quit the app")
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
