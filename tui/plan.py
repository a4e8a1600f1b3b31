"""Plan tab: budgets as inputs; the candidate table and the reasons follow as they change."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from edgekit.converters.planner import (
    DEFAULT_CONTEXT,
    Budgets,
    Plan,
    describe,
    plan,
    resolve_device,
    with_budget_defaults,
)
from edgekit.tui.shown import cell, content, plain_lines
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import DataTable, Input, Label, Static
from textual.worker import get_current_worker

from edgekit.cli.plan_view import COLUMNS, candidate_cells, parse_size, parse_watts
from edgekit.devices import DeviceProfile
from edgekit.errors import EdgekitError, PlanError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp

# input id -> (label, placeholder)
FIELDS = {
    "memory": ("memory", "device's"),
    "power": ("watts", "no cap"),
    "ctx": ("context", "4096 or model's"),
    "min-tps": ("min tok/s", "none"),
    "max-loss": ("max KL", "none"),
}
DEBOUNCE_S = 0.3


class PlanPane(Vertical):
    def __init__(self) -> None:
        super().__init__()
        self._spec: ModelSpec | None = None
        self._profiles: dict[str, tuple[DeviceProfile, str | None]] = {}
        self._debounce: Timer | None = None

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def compose(self) -> ComposeResult:
        with Horizontal(id="budgets"):
            for key, (label, placeholder) in FIELDS.items():
                with Vertical(classes="budget"):
                    yield Label(label)
                    yield Input(placeholder=placeholder, id=f"budget-{key}")
        yield Static("planning...", id="plan-summary")
        yield DataTable(id="candidates", cursor_type="row", zebra_stripes=True)
        yield Static("", id="plan-reasons")

    def on_mount(self) -> None:
        table = self.query_one("#candidates", DataTable)
        table.add_columns(*COLUMNS, "why not")
        self.replan()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self._debounce is not None:
            self._debounce.stop()
        self._debounce = self.set_timer(DEBOUNCE_S, self.replan)

    def budgets(self) -> Budgets:
        """The budgets typed so far.

        Raises:
            PlanError: a field that is not a size, a power or a number.
        """

        def text(key: str) -> str:
            return self.query_one(f"#budget-{key}", Input).value.strip()

        def number(key: str, what: str) -> float | None:
            value = text(key)
            if not value:
                return None
            try:
                return float(value)
            except ValueError as exc:
                raise PlanError(f"{what} {value!r} is not a number") from exc

        ctx = number("ctx", "context")
        return Budgets(
            memory_bytes=parse_size(text("memory")) if text("memory") else None,
            watts=parse_watts(text("power")) if text("power") else None,
            context=int(ctx) if ctx else DEFAULT_CONTEXT,
            min_decode_tok_s=number("min-tps", "min tok/s"),
            max_quality_loss=number("max-loss", "max KL"),
        )

    def replan(self) -> None:
        try:
            budgets = self.budgets()
        except EdgekitError as exc:
            # a plan still running for the previous budgets must not land over the error
            self.workers.cancel_group(self, "plan")
            self.query_one("#plan-summary", Static).update(
                content("[red]$message[/red] ($hint)", message=exc.message, hint=exc.hint)
            )
            return
        self.plan_in_background(budgets, self.edgekit.sources.device)

    @work(thread=True, exclusive=True, group="plan")
    def plan_in_background(self, budgets: Budgets, device: str) -> None:
        # A newer plan cancels this worker, but a thread runs on to its end: its result
        # (or its error) is delivered only if no newer plan started meanwhile, else a slow
        # plan for the previous device would land after, and over, the current one.
        worker = get_current_worker()

        def deliver(callback: Callable[..., None], *args: Any, **kwargs: Any) -> None:
            if not worker.is_cancelled:
                callback(*args, **kwargs)

        try:
            if self._spec is None:
                self._spec = inspect_model(self.edgekit.sources.plan_model())
            if device not in self._profiles:
                self._profiles[device] = resolve_device(device)
            profile, key = self._profiles[device]
            result = plan(
                self._spec, profile, with_budget_defaults(self._spec, budgets), calibrate_for=key
            )
        except EdgekitError as exc:
            self.app.call_from_thread(deliver, self.edgekit.report, exc, title="plan")
            return
        self.app.call_from_thread(deliver, self.show, result)

    def show(self, result: Plan) -> None:
        b = result.budgets
        # the model's and the device's names come from their files: plain text in markup
        self.query_one("#plan-summary", Static).update(
            content(
                "[b]$model[/b] on [b]$device[/b]$rest\n$summary",
                model=result.model,
                device=result.device_display,
                rest=f", ctx {b.context}"
                + (f", power mode {result.power_mode}" if result.power_mode else ""),
                summary=result.summary,
            )
        )
        table = self.query_one("#candidates", DataTable)
        table.clear()
        for c in result.candidates:
            why = c.rejections[0] if c.rejections else ("fits" if c.buildable else c.build_note)
            cells = (cell(x, max_len=2000) for x in (*candidate_cells(c, result.choice), why))
            table.add_row(*cells)
        lines = ([describe(result.choice)] if result.choice else []) + [
            f"note: {n}" for n in result.notes
        ]
        basis = (
            "calibrated on this host"
            if any(c.prediction.basis == "calibrated" for c in result.candidates)
            else "first estimates"
        )
        lines = (lines or [""]) + [f"* the pick  ~ predicted only  est./cal.: {basis}"]
        self.query_one("#plan-reasons", Static).update(plain_lines(lines))
