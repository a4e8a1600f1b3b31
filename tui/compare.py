"""Compare tab: saved bench results side by side, as a table and a chart.

The results are the JSON files in the results folder (`--results`, default the cache's
``results/``; the Bench tab saves there). Space or enter marks a result; marked results
(or, with none marked, the newest four) are set side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from edgekit.tui.shown import cell, plain
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp

    from edgekit.bench import BenchResult

SIDE_BY_SIDE = 4
FIGURES = (
    ("decode_tok_s", "decode tok/s"),
    ("prefill_128_tok_s", "prefill 128 tok/s"),
    ("prefill_512_tok_s", "prefill 512 tok/s"),
    ("ttft_512_s", "TTFT 512 s"),
    ("load_s", "load s"),
    ("peak_rss_mb", "peak RSS MB"),
    ("decode_w", "decode W"),
    ("decode_j_per_token", "J/token"),
)


class ComparePane(Vertical):
    BINDINGS = [
        Binding("space", "mark", "Mark"),
        Binding("g", "reload", "Reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.results: list[tuple[Path, BenchResult]] = []
        self.marked: set[Path] = set()

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static("", id="compare-folder")
        yield DataTable(id="compare-files", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="compare-body"):
            yield DataTable(id="compare-table", zebra_stripes=True)
            yield PlotextPlot(id="compare-chart")

    def on_mount(self) -> None:
        files = self.query_one("#compare-files", DataTable)
        files.add_columns("", "file", "variant", "target", "meter", "decode tok/s")
        self.reload()

    def action_reload(self) -> None:
        self.reload()

    def reload(self) -> None:
        from edgekit.bench_results import load_result

        folder = self.edgekit.sources.results
        self.results = []
        skipped = 0
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                self.results.append((path, load_result(path)))
            except EdgekitError:
                skipped += 1  # not a bench result (another JSON file in the folder)
        self.query_one("#compare-folder", Static).update(
            plain(
                f"results in {folder}: {len(self.results)}"
                + (f" ({skipped} other JSON files skipped)" if skipped else "")
                + ("" if self.results else " - run the Bench tab, or start with --results DIR")
            )
        )
        self.redraw()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "compare-files":  # enter on a result marks it
            self.action_mark()

    def action_mark(self) -> None:
        files = self.query_one("#compare-files", DataTable)
        if not self.results or files.cursor_row < 0:
            return
        path = self.results[files.cursor_row][0]
        self.marked ^= {path}
        self.redraw(keep_cursor=files.cursor_row)

    def chosen(self) -> list[tuple[Path, BenchResult]]:
        marked = [(p, r) for p, r in self.results if p in self.marked]
        return marked or self.results[-SIDE_BY_SIDE:]

    def redraw(self, keep_cursor: int | None = None) -> None:
        from edgekit.bench_results import headline

        files = self.query_one("#compare-files", DataTable)
        files.clear()
        # a saved result is a file like any other: its file name and names are data
        for path, r in self.results:
            files.add_row(
                "x" if path in self.marked else "",
                cell(path.name),
                cell(r.variant),
                cell(f"{r.target} {r.quant}"),
                cell(r.meter.name + ("" if r.meter.measured else " (est.)")),
                f"{r.runs[0].decode.tok_s.median:.1f}" if r.runs else "-",
            )
        if keep_cursor is not None:
            files.move_cursor(row=keep_cursor)
        chosen = self.chosen()
        table = self.query_one("#compare-table", DataTable)
        table.clear(columns=True)
        table.add_column("figure")
        for i, (_, r) in enumerate(chosen):
            table.add_column(cell(f"{chr(65 + i)}: {r.variant}"))
        heads = [headline(r) if r.runs else {} for _, r in chosen]
        for key, label in FIGURES:
            values = [h.get(key) for h in heads]
            if all(v is None for v in values):
                continue
            table.add_row(label, *(_figure(v) for v in values))
        plot = self.query_one("#compare-chart", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.title("decode tokens/s")
        if chosen:
            names = [chr(65 + i) for i in range(len(chosen))]
            plt.bar(names, [h.get("decode_tok_s") or 0 for h in heads])
        plot.refresh()


def _figure(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
