"""``edgekit plan``: which target and format fit a device, predicted and explained."""

from __future__ import annotations

from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.table import Table

from edgekit.cli import emit_json, json_option, main, render
from edgekit.cli.plan_view import (
    COLUMNS,
    PARALLEL_COLUMNS,
    TEXT_COLUMNS,
    candidate_cells,
    parallel_cells,
    parse_size,
    parse_watts,
)
from edgekit.converters.planner import (
    DEFAULT_CONTEXT,
    MAX_PARALLEL,
    MAX_SUGGESTED_PARALLEL,
    Budgets,
    Plan,
    plan_for,
)
from edgekit.default_model import default_model_path


def budget_options(f: click.decorators.FC) -> click.decorators.FC:
    """The budget flags ``plan`` and ``pack --device`` share."""
    for option in reversed(
        (
            click.option(
                "--memory", help="Memory budget, e.g. 6GB or 4GiB (default: the device's)."
            ),
            click.option(
                "--power", help="Power budget, e.g. 10W (picks a power mode where there are modes)."
            ),
            click.option(
                "--ctx", type=int, help="Context length to plan for [default: 4096 or the model's]."
            ),
            click.option("--min-tps", type=float, help="Slowest acceptable decode, tokens/s."),
            click.option(
                "--max-quality-loss",
                type=float,
                help="Largest acceptable mean KL vs the source (nats/token), e.g. 0.05.",
            ),
            click.option("--kv-cache", default="f16", show_default=True, help="KV-cache type."),
        )
    ):
        f = option(f)
    return f


def budgets_from(
    memory: str | None,
    power: str | None,
    ctx: int | None,
    min_tps: float | None,
    max_quality_loss: float | None,
    kv_cache: str,
    parallel: int = 1,
) -> Budgets:
    return Budgets(
        memory_bytes=parse_size(memory) if memory else None,
        watts=parse_watts(power) if power else None,
        context=ctx if ctx is not None else DEFAULT_CONTEXT,
        min_decode_tok_s=min_tps,
        max_quality_loss=max_quality_loss,
        kv_cache=kv_cache.lower(),
        parallel=parallel,
    )


@main.command("plan")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option(
    "--device",
    "-d",
    default="host",
    show_default=True,
    help="A device profile name (edgekit profiles), a profile .toml, or host.",
)
@budget_options
@click.option(
    "--parallel",
    type=click.IntRange(1, MAX_PARALLEL),
    default=1,
    show_default=True,
    help="Generations decoded together (edgekit serve --parallel): memory counts a KV cache "
    "of the context for each; decode adds the aggregate and per-stream figures.",
)
@click.option("--all", "show_all", is_flag=True, help="List every candidate, not only the best.")
@json_option
def plan_command(
    model: Path | None,
    device: str,
    memory: str | None,
    power: str | None,
    ctx: int | None,
    min_tps: float | None,
    max_quality_loss: float | None,
    kv_cache: str,
    parallel: int,
    show_all: bool,
    as_json: bool,
) -> None:
    """Pick target, format and recipe for MODEL on a device, with predicted memory,
    tokens/s, watts and quality loss, and a reason for every rejection.

    MODEL is a .gguf file, a Hugging Face folder, or a folder (or config.json) with only a
    config: no weights are needed. Without MODEL, plans the embedded default model.
    """
    budgets = budgets_from(memory, power, ctx, min_tps, max_quality_loss, kv_cache, parallel)
    result = plan_for(model if model is not None else default_model_path(), device, budgets)
    if as_json:
        emit_json(result.to_dict())
        return
    render_plan(result, render.console(), show_all=show_all)


def render_plan(result: Plan, console: Console, *, show_all: bool = False) -> None:
    b = result.budgets
    # the model's and the device's names come from their files: plain Text pieces
    console.print(
        render.line(
            render.name(result.model, "bold"),
            f" ({result.family}, {result.parameters / 1e9:.2f}B parameters"
            f"{', from config' if result.parameters_source == 'config' else ''}) on ",
            render.name(result.device_display, "bold"),
            f", ctx {b.context}, KV {b.kv_cache}"
            + (f", {b.parallel} streams" if b.parallel > 1 else "")
            + (f", power mode {result.power_mode}" if result.power_mode else ""),
        )
    )
    # box.SIMPLE and short headings: the table fits an 80-column terminal
    table = Table(box=box.SIMPLE, pad_edge=False, collapse_padding=True, title_justify="left")
    # with several streams: decode tok/s of each one and of all together (first
    # estimates: no batched benchmark calibrates them)
    streams = b.parallel > 1
    for column in (*(PARALLEL_COLUMNS if streams else COLUMNS), "basis"):
        right = column not in (*TEXT_COLUMNS, "basis")
        table.add_column(column, justify="right" if right else "left")
    fitting = [c for c in result.candidates if c.fits]
    rejected = [c for c in result.candidates if not c.fits]
    shown = fitting if show_all else fitting[:6]
    for c in shown:
        basis = "cal." if c.prediction.basis == "calibrated" else "est."
        cells = (parallel_cells if streams else candidate_cells)(c, result.choice)
        table.add_row(*(render.text(cell) for cell in cells), basis)
    if shown:
        console.print(table)
        console.print(
            "* the pick  ~ predicted only (edgekit cannot build it yet)  decode/prefill in tok/s"
            "  est. first estimate  cal. calibrated on this host",
            style="dim",
        )
        if streams:
            console.print(
                f"each/all: decode tok/s of each of {b.parallel} streams and of all together "
                "(first estimate: a step reads the weights once for every stream)",
                style="dim",
            )
    _render_streams(result, console)
    _render_power_modes(result, console)
    console.print()
    console.print(render.text(result.summary, "bold"))
    for note in result.notes:
        console.print(render.text(f"note: {note}", "dim"))
    for note in _prediction_only(result):
        console.print(render.text(f"~ {note}", "dim"))
    if rejected:
        console.print()
        console.print("rejected", style="bold")
        for c in rejected if show_all else rejected[:12]:
            console.print(render.text(f"  {c.label}: {c.rejections[0]}"))
        if not show_all and len(rejected) > 12:
            console.print(f"  ... {len(rejected) - 12} more (--all)", style="dim")


def _render_streams(result: Plan, console: Console) -> None:
    """How many streams the pick holds at the plan's context: serve's default --parallel."""
    pick = result.choice or result.best
    if pick is None:
        return
    n = result.parallel_suggested
    most = " (the most suggested)" if n >= MAX_SUGGESTED_PARALLEL else ""
    console.print(
        render.text(
            f"streams: {pick.label} holds {n} at ctx {result.budgets.context}{most}: "
            f"edgekit serve --parallel {max(n, 1)}",
            "dim",
        )
    )


def _render_power_modes(result: Plan, console: Console) -> None:
    """The pick under each power mode of the device, one line each, so a user can trade
    tokens/s for watts (``--power`` picks the fastest mode within a budget)."""
    pick = result.choice or result.best
    if not result.power_modes or pick is None:
        return
    console.print(render.text(f"power modes ({pick.label}):", "dim"))
    for m in result.power_modes:
        figures = ", ".join(
            part
            for part in (
                f"{m.decode_tok_s:.1f} tok/s" if m.decode_tok_s else "",
                f"{m.watts:g} W" if m.watts else "",
                f"{m.joules_per_token:.2f} J/tok" if m.joules_per_token else "",
            )
            if part
        )
        mark = "*" if m.chosen else (" " if m.fits else "x")
        over = "" if m.fits else " (over a budget)"
        console.print(render.text(f"  {mark} {m.mode}: {figures or 'no prediction'}{over}", "dim"))


def _prediction_only(result: Plan) -> list[str]:
    """Why the "~" candidates are predicted only, one line per target, unit and reason
    ("tensorrt INT8, INT4 on GPU: quantizing for ... needs ...")."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for c in result.candidates:
        if not c.buildable:
            groups.setdefault((c.target, c.unit, c.build_note), []).append(c.format)
    return [
        f"{target} {', '.join(formats)} on {unit.upper()}: {why or 'not built by edgekit'}"
        for (target, unit, why), formats in groups.items()
    ]
