"""Load tab: `edgekit loadtest` on an OpenAI-compatible server, from the TUI.

The inputs are the command's (with its defaults); Start runs the sweep in a thread
worker through ``edgekit.loadtest.run_loadtest``, so the library's rules hold as they do
for the command: loopback only unless "--allow-remote" is ticked, each level bounded in
requests and time, each request in time. A row appears as each level ends, with the
figures (and their formatting) of the command's table. Stop ends the run: no request
starts after it and the streams in flight are cut at their next line (one the
server has not begun to answer ends with its first line, or its timeout); the levels
that had ended stay. Failures (nothing listening, a refused URL, an input that does not
parse) are notifications, through the workers' failure path.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from edgekit.tui.shown import cell, plain, plain_lines
from edgekit.tui.workers import background, report_failure
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, DataTable, Input, Label, ProgressBar, Static
from textual.worker import Worker

from edgekit.cli.loadtest_view import CAPTION, COLUMNS, level_cells, notes, numbers, title
from edgekit.errors import ServeError
from edgekit.loadtest import LoadPlan

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp

    from edgekit.loadtest_stats import LevelResult, LoadTestResult

# The command's defaults, from the library's plan (the command's options repeat them).
DEFAULTS = LoadPlan(url="http://127.0.0.1")
# input id (the `edgekit loadtest` option's name) -> (label, default)
FIELDS = {
    "concurrency": ("clients at once", ",".join(map(str, DEFAULTS.concurrency))),
    "requests": ("requests a level", str(DEFAULTS.requests)),
    "prompt-tokens": ("prompt tokens", str(DEFAULTS.prompt_tokens)),
    "max-tokens": ("max tokens", str(DEFAULTS.max_tokens)),
}


@dataclass(frozen=True, kw_only=True)
class LoadForm:
    """What the inputs held when Start was pressed (read on the app's thread; turned into
    a plan on the worker's, so a bad value fails there like any other error)."""

    url: str
    concurrency: str
    requests: str
    prompt_tokens: str
    max_tokens: str
    allow_remote: bool

    def plan(self, *, api_key: str | None) -> LoadPlan:
        """The plan the command would make of the same values.

        Raises:
            ServeError: a value that is not a number (or a list of them for clients), or
                one the plan refuses (out of range, not an http(s) URL).
        """
        return LoadPlan(
            url=self.url.strip(),
            api_key=api_key,
            concurrency=numbers("--concurrency", self.concurrency, int),
            requests=_count("--requests", self.requests),
            prompt_tokens=_count("--prompt-tokens", self.prompt_tokens),
            max_tokens=_count("--max-tokens", self.max_tokens),
            allow_remote=self.allow_remote,
        )


def _count(flag: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ServeError(
            f"{flag} {text!r} is not a whole number", hint="pass one, such as 32"
        ) from None


class LoadPane(Vertical):
    def __init__(self) -> None:
        super().__init__()
        self._stop = threading.Event()
        self._loading = False  # (not _running: every Textual widget has one)
        self._levels_asked = 0
        self.levels: list[LevelResult] = []  # the rows shown, as their levels ended
        self.result: LoadTestResult | None = None  # the last run's, once it ended
        self.status = ""

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def compose(self) -> ComposeResult:
        with Horizontal(id="load-inputs"):
            with Vertical(classes="load-field", id="load-field-url"):
                yield Label("server (OpenAI-compatible API root)")
                yield Input(value=self.edgekit.sources.load_url, id="load-url")
            for key, (label, default) in FIELDS.items():
                with Vertical(classes="load-field"):
                    yield Label(label)
                    yield Input(value=default, id=f"load-{key}")
        with Horizontal(id="load-controls"):
            yield Button("Start", id="load-start", variant="primary")
            yield Button("Stop", id="load-stop", variant="error", disabled=True)
            yield Checkbox("--allow-remote (only a server you run)", id="load-allow-remote")
        yield ProgressBar(id="load-progress", show_eta=False, total=1)
        yield Static("", id="load-status")
        yield DataTable(id="load-table", zebra_stripes=True, cursor_type="row")
        yield Static("", id="load-notes")

    def on_mount(self) -> None:
        self.query_one("#load-table", DataTable).add_columns(*_row(COLUMNS))
        self._show_status("press Start to load the server (a flood: only one you run)")

    def on_unmount(self) -> None:
        self._stop.set()  # the app is closing: no request starts after it

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "load-start":
            self.action_start()
        elif event.button.id == "load-stop":
            self.action_stop()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_start()

    def form(self) -> LoadForm:
        def value(key: str) -> str:
            return self.query_one(f"#load-{key}", Input).value

        return LoadForm(
            url=value("url"),
            concurrency=value("concurrency"),
            requests=value("requests"),
            prompt_tokens=value("prompt-tokens"),
            max_tokens=value("max-tokens"),
            allow_remote=self.query_one("#load-allow-remote", Checkbox).value,
        )

    def action_start(self) -> None:
        if self._loading:
            return
        self._stop.clear()
        self._loading = True
        self.levels = []
        self.result = None
        self._levels_asked = 0
        self.query_one("#load-table", DataTable).clear()
        self.query_one("#load-notes", Static).update("")
        self.query_one("#load-progress", ProgressBar).update(total=None, progress=0)
        self.query_one("#load-start", Button).disabled = True
        self.query_one("#load-stop", Button).disabled = False
        self._show_status("starting: listing the server's models, warming up")
        self.run_load(self.form())

    def action_stop(self) -> None:
        if self._loading and not self._stop.is_set():
            self._stop.set()
            self.query_one("#load-stop", Button).disabled = True
            self._show_status("stopping: cutting the requests in flight")

    @background("load")
    def run_load(self, form: LoadForm) -> None:
        # looked up at each run, as the Bench tab does (tests watch the library's calls)
        from edgekit.loadtest import run_loadtest, server_for

        plan = form.plan(api_key=self.edgekit.sources.api_key)
        server, local = server_for(plan)  # a refused URL fails here, before any request
        if not local:
            self.app.call_from_thread(
                self.edgekit.say,
                f"loading {server.host}, which is not this machine (--allow-remote)",
                title="load",
                severity="warning",
            )
        self.app.call_from_thread(self.begin, len(plan.concurrency))
        result = run_loadtest(
            plan,
            progress=lambda label: self.app.call_from_thread(self.level_started, label),
            level_done=lambda level: self.app.call_from_thread(self.level_done, level),
            stop=self._stop,
        )
        self.app.call_from_thread(self.finished, result)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A run that failed (anything it raised) is a notification; the tab is ready to
        start again."""
        if report_failure(self.edgekit, event) == "load":
            self.finished(None)

    def begin(self, levels: int) -> None:
        self._levels_asked = levels
        self.query_one("#load-progress", ProgressBar).update(total=levels, progress=0)

    def level_started(self, label: str) -> None:
        if not self._stop.is_set():
            n = len(self.levels) + 1
            self._show_status(f"loading: {label} (level {n} of {self._levels_asked})")

    def level_done(self, level: LevelResult) -> None:
        self.levels.append(level)
        self.query_one("#load-table", DataTable).add_row(*_row(level_cells(level)))
        self.query_one("#load-progress", ProgressBar).update(progress=len(self.levels))

    def finished(self, result: LoadTestResult | None) -> None:
        self._loading = False
        self.query_one("#load-start", Button).disabled = False
        self.query_one("#load-stop", Button).disabled = True
        if result is None:
            self._show_status("failed")
            return
        self.result = result
        ended = f"{len(result.levels)} of {self._levels_asked} levels"
        self._show_status(f"stopped: {ended}" if self._stop.is_set() else f"done: {ended}")
        self.query_one("#load-notes", Static).update(
            plain_lines([title(result), *notes(result), CAPTION])
        )

    def _show_status(self, status: str) -> None:
        self.status = status
        self.query_one("#load-status", Static).update(plain(status))


def _row(values: Sequence[str]) -> list[Text]:
    """Cells of COLUMNS: the figures to the right, lined up as in the command's table."""
    cells = [cell(v) for v in values]
    for figure in cells[1:]:
        figure.justify = "right"
    return cells
