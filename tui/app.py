"""The edgekit terminal UI: one app, six tabs (Device, Plan, Bench, Compare, Chat, Load).

Everything slow (probing, planning, packing, benchmarking, generating) runs in thread
workers; a worker hands its results back with ``call_from_thread``, so the interface never
blocks. Errors become notifications carrying the edgekit hint, never a traceback.

The app holds what the tabs share: the model (for planning), the bundle (for Bench and
Chat), the device chosen on the Device tab, the folder of saved bench results, and the
server the Load tab loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.tui.bench import BenchPane
from edgekit.tui.chat import ChatPane
from edgekit.tui.compare import ComparePane
from edgekit.tui.device import DevicePane
from edgekit.tui.loadtest import LoadPane
from edgekit.tui.plan import PlanPane
from edgekit.tui.shown import TEXT_MAX
from edgekit.tui.sources import Sources
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Header, Input, TabbedContent, TabPane

from edgekit.errors import EdgekitError
from edgekit.untrusted import clean_text


class EdgekitApp(App[None]):
    """``edgekit tui``. ``sources`` says what to plan, bench and chat with; tests pass
    fakes for the host probe and the clock through it."""

    TITLE = "edgekit"
    CSS_PATH = "edgekit.tcss"
    BINDINGS = [
        Binding("d", "show('device')", "Device"),
        Binding("p", "show('plan')", "Plan"),
        Binding("b", "show('bench')", "Bench"),
        Binding("c", "show('compare')", "Compare"),
        Binding("h", "show('chat')", "Chat"),
        Binding("l", "show('load')", "Load"),
        Binding("r", "bench('run')", "Run bench"),
        Binding("s", "bench('stop')", "Stop bench"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, sources: Sources) -> None:
        super().__init__()
        self.sources = sources

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="device"):
            with TabPane("Device", id="device"):
                yield DevicePane()
            with TabPane("Plan", id="plan"):
                yield PlanPane()
            with TabPane("Bench", id="bench"):
                yield BenchPane()
            with TabPane("Compare", id="compare"):
                yield ComparePane()
            with TabPane("Chat", id="chat"):
                yield ChatPane()
            with TabPane("Load", id="load"):
                yield LoadPane()
        yield Footer()

    def _typing(self) -> bool:
        """Letters typed into an input are text, not commands."""
        return isinstance(self.focused, Input)

    def action_show(self, tab: str) -> None:
        if not self._typing():
            self.query_one(TabbedContent).active = tab

    def action_bench(self, what: str) -> None:
        if self._typing():
            return
        pane = self.query_one(BenchPane)
        if what == "run":
            self.query_one(TabbedContent).active = "bench"
            pane.action_run()
        else:
            pane.action_stop()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "chat":  # ready to type
            self.query_one("#chat-input", Input).focus()

    def device_changed(self, device: str) -> None:
        """The Device tab picked another device: the plan follows."""
        self.sources.device = device
        self.query_one(PlanPane).replan()

    def bundle_changed(self, bundle: Path) -> None:
        self.sources.bundle = bundle
        self.query_one(BenchPane).show_bundle()
        self.query_one(ChatPane).show_bundle()

    def result_saved(self, path: Path) -> None:
        self.query_one(ComparePane).reload()
        self.say(f"saved {path}", title="bench")

    def say(self, message: str, **kwargs: Any) -> None:
        """A notification whose message may hold names and paths from files: cleaned of
        control characters and shown as plain text, never read as markup."""
        self.notify(clean_text(message, max_len=TEXT_MAX), markup=False, **kwargs)

    def report(self, exc: BaseException, *, title: str) -> None:
        """An error as a notification: the message and, for edgekit errors, the hint."""
        if isinstance(exc, EdgekitError):
            lines = [exc.message] + ([f"hint: {exc.hint}"] if exc.hint else [])
        else:
            lines = [f"{type(exc).__name__}: {exc}"]
        # each line cleaned on its own: the line break before the hint is the app's
        text = "\n".join(clean_text(line, max_len=TEXT_MAX) for line in lines)
        self.notify(text, title=title, severity="error", timeout=10, markup=False)


def run_app(sources: Sources, **kwargs: Any) -> None:
    EdgekitApp(sources).run(**kwargs)
