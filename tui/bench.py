"""Bench tab: run `edgekit bench` on the bundle with a progress bar and live charts of
tokens/s and watts; stop at any time. Without a bundle, pack one for this host first."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from edgekit.tui.shown import cell, content, plain
from edgekit.tui.workers import background, report_failure
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, ProgressBar, Select, Static
from textual.worker import Worker
from textual_plotext import PlotextPlot

from edgekit.atomic import write_atomic
from edgekit.errors import BenchStoppedError, EdgekitError
from edgekit.progress import ProgressEvent

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp

    from edgekit.bench import BenchResult, LiveSample

# What the Bench tab runs: short enough to watch, long enough to settle.
BENCH_SETTINGS = {"prompt_lengths": (128, 512), "gen_tokens": 128, "repeats": 2, "warmup": 1}
REDRAW_S = 0.25  # the charts are redrawn at most this often while samples stream in


class BenchPane(Vertical):
    """r and s are the app's keys (they work from any tab)."""

    class Live(Message):
        """A live sample or a step done, posted from the benchmark's thread: the
        benchmark never waits for the screen (a wait inside its decode loop would slow
        what it measures)."""

        def __init__(self, sample: LiveSample | None, step: ProgressEvent | None) -> None:
            super().__init__()
            self.sample = sample
            self.step = step

    def __init__(self) -> None:
        super().__init__()
        self._stop_event = threading.Event()
        self._benchmarking = False
        self._drawn_at = 0.0
        self._redraw_due = False
        self.decode: list[tuple[float, float]] = []  # (t, tok/s)
        self.watts: list[tuple[float, float]] = []
        self.stats: dict[str, str] = {}

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static("", id="bench-bundle")
        with Horizontal(id="bench-controls"):
            yield Select([], prompt="variant", id="bench-variant")
            yield Button("Run (r)", id="bench-run", variant="primary")
            yield Button("Stop (s)", id="bench-stop", variant="error", disabled=True)
            yield Button("Pack for this host", id="bench-pack")
        bar = ProgressBar(id="bench-progress", show_eta=False, total=1)  # 0% until a run starts
        yield bar
        yield Static("", id="bench-stats")
        with Horizontal(id="bench-charts"):
            yield PlotextPlot(id="chart-tps")
            yield PlotextPlot(id="chart-watts")

    def on_mount(self) -> None:
        self.show_bundle()
        self.redraw()

    def show_bundle(self) -> None:
        from edgekit.bundle_open import open_bundle

        bundle = self.edgekit.sources.bundle
        info = self.query_one("#bench-bundle", Static)
        select = self.query_one("#bench-variant", Select)
        self.query_one("#bench-pack", Button).display = bundle is None
        if bundle is None:
            info.update(
                "No bundle: start `edgekit tui BUNDLE`, or pack the plan's pick for this host "
                "(Pack for this host)."
            )
            select.set_options([])
            return
        try:
            opened = open_bundle(bundle)
        except EdgekitError as exc:
            self.edgekit.report(exc, title="bundle")
            return
        names = [v.name for v in opened.manifest.variants]
        select.set_options([(cell(n), n) for n in names])
        select.value = names[0]
        # the manifest's names are data: inserted as plain text
        info.update(
            content(
                "[b]$name[/b] ($path): $variants",
                name=opened.manifest.name,
                path=bundle,
                variants=", ".join(names),
            )
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "bench-run":
            self.action_run()
        elif event.button.id == "bench-stop":
            self.action_stop()
        elif event.button.id == "bench-pack":
            self.pack_for_host()

    def action_run(self) -> None:
        if self._benchmarking:
            return
        bundle = self.edgekit.sources.bundle
        if bundle is None:
            self.edgekit.say("no bundle to measure: pack one first", severity="warning")
            return
        variant = self.query_one("#bench-variant", Select).value
        self._stop_event.clear()
        self._benchmarking = True
        self.decode.clear()
        self.watts.clear()
        self.stats = {}
        self.query_one("#bench-run", Button).disabled = True
        self.query_one("#bench-stop", Button).disabled = False
        self.run_bench(bundle, variant if isinstance(variant, str) else None)

    def action_stop(self) -> None:
        if self._benchmarking:
            self._stop_event.set()

    @background("bench")
    def run_bench(self, bundle: Path, variant: str | None) -> None:
        from edgekit.bench import bench

        try:
            result = bench(
                bundle,
                variant=variant,
                progress=lambda e: self._post(None, e),
                live=lambda s: self._post(s, None),
                stop=self._stop_event,
                **BENCH_SETTINGS,  # type: ignore[arg-type]
            )
        except BenchStoppedError:
            self.app.call_from_thread(self.finished, None, "stopped")
            return
        path = self.save(result)
        # Compare has the result before the status says done
        self.app.call_from_thread(self.edgekit.result_saved, path)
        self.app.call_from_thread(self.finished, result, f"done: {path.name}")

    def save(self, result: BenchResult) -> Path:
        """Keep the result for the Compare tab (and feed the planner's calibration)."""
        from edgekit.bench_results import record_calibration
        from edgekit.probe import probe_host

        folder = self.edgekit.sources.results
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        path = folder / f"{stamp}-{_file_name(result.variant)}.json"
        write_atomic(path, json.dumps(result.to_dict(), indent=2))
        try:
            record_calibration(result, probe_host().profile)
        except Exception as exc:  # noqa: BLE001 - the result is saved: calibration is extra
            self.app.call_from_thread(self.edgekit.report, exc, title="calibration")
        return path

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A failed benchmark or pack (anything it raised) is a notification; the tab is
        ready to run again."""
        if report_failure(self.edgekit, event) == "bench":
            self.finished(None, "failed")

    def on_progress(self, event: ProgressEvent) -> None:
        bar = self.query_one("#bench-progress", ProgressBar)
        bar.update(total=event.total or None, progress=event.done)
        self.stats["step"] = event.detail

    def _post(self, sample: LiveSample | None, step: ProgressEvent | None) -> None:
        self.post_message(self.Live(sample, step))  # thread-safe, and it does not wait

    def on_bench_pane_live(self, message: Live) -> None:
        if not self._benchmarking:  # what arrives after the end is not shown
            return
        if message.step is not None:
            self.on_progress(message.step)
        if message.sample is not None:
            self.on_live(message.sample)

    def on_live(self, sample: LiveSample) -> None:
        if sample.tok_s is not None and sample.phase == "decode":
            self.decode.append((sample.t, sample.tok_s))
        if sample.watts is not None:
            self.watts.append((sample.t, sample.watts))
        if sample.ttft_s is not None:
            self.stats["TTFT"] = f"{sample.ttft_s:.3f} s"
            self.stats["prefill"] = f"{sample.tok_s or 0:.0f} tok/s"
        if sample.phase == "decode" and sample.tok_s:
            self.stats["decode"] = f"{sample.tok_s:.1f} tok/s"
        self.stats["memory"] = f"{sample.rss_mb:.0f} MB RSS"
        if sample.watts is not None:
            kind = "measured" if sample.watts_measured else "estimated"
            self.stats["power"] = f"{sample.watts:.1f} W ({kind})"
        self._redraw_soon()

    def _redraw_soon(self) -> None:
        """Redraw now, or (drawn less than REDRAW_S ago) once when that time is up."""
        wait = self._drawn_at + REDRAW_S - time.monotonic()
        if wait <= 0:
            self.redraw()
        elif not self._redraw_due:
            self._redraw_due = True
            self.set_timer(wait, self.redraw)

    def finished(self, result: BenchResult | None, status: str) -> None:
        self._benchmarking = False
        self.query_one("#bench-run", Button).disabled = False
        self.query_one("#bench-stop", Button).disabled = True
        self.stats["status"] = status
        if result is not None and result.runs:
            run = result.runs[0]
            self.stats["decode"] = f"{run.decode.tok_s.median:.1f} tok/s (median)"
            self.stats["memory"] = f"{run.peak_rss_mb:.0f} MB peak RSS"
        self.redraw()

    def redraw(self) -> None:
        self._drawn_at, self._redraw_due = time.monotonic(), False
        order = ("status", "step", "TTFT", "prefill", "decode", "memory", "power")
        shown = [k for k in order if k in self.stats]
        # a step's detail names a variant or a file: each value is plain text
        stats = content(
            "   ".join(f"[b]{k}[/b] ${k.lower()}" for k in shown),
            **{k.lower(): self.stats[k] for k in shown},
        )
        self.query_one("#bench-stats", Static).update(
            stats if shown else plain("press r to run the benchmark")
        )
        for widget_id, series, title in (
            ("#chart-tps", self.decode, "decode tokens/s"),
            ("#chart-watts", self.watts, "watts"),
        ):
            plot = self.query_one(widget_id, PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.title(title)
            plt.xlabel("s")
            if series:
                plt.plot([t for t, _ in series], [v for _, v in series], marker="braille")
            plot.refresh()

    @background("pack")
    def pack_for_host(self) -> None:
        """Pack the plan's pick for this host into the cache and use it."""
        from edgekit.converters.planner import plan_for

        from edgekit.bundle import VariantRequest, pack

        sources = self.edgekit.sources
        model = sources.plan_model()
        out = sources.results.parent / "tui-bundles" / f"{model.stem}-host"
        request = VariantRequest.from_plan(plan_for(model, "host"))
        self.app.call_from_thread(
            self.edgekit.say, f"packing {request.target} {request.quant} for this host"
        )
        pack(
            model,
            out,
            [request],
            force=True,
            progress=lambda e: self.app.call_from_thread(self.on_progress, e),
        )
        self.app.call_from_thread(self.edgekit.bundle_changed, out)


def _file_name(variant: str) -> str:
    """A variant's name as part of a file name: a manifest can name a variant
    ``../../x`` or with control characters, and the result must land in the folder."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in variant)
    return safe.strip(".")[:80] or "variant"
