"""``edgekit bench``: measure a bundle on this host; ``--compare`` two saved results."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from edgekit.atomic import write_atomic
from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.cli.progress import progress_bars


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip()) if text else ()


@main.command("bench")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--variant", help="Variant to measure (default: the one load() picks).")
@click.option("--threads", help="Thread counts to sweep, e.g. 1,2,4 (default: physical cores).")
@click.option("--ctx", type=int, help="Context length.")
@click.option("--prompt-lengths", default="128,512", show_default=True)
@click.option("--gen-tokens", default=128, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=int)
@click.option("--warmup", default=1, show_default=True, type=int)
@click.option(
    "--meter", help="Power meter to use: rapl, nvml, jetson-ina, powermetrics, battery, estimated."
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Save the result JSON here.")
@click.option(
    "--calibrate/--no-calibrate",
    default=True,
    show_default=True,
    help="Feed the result to the planner's calibration for this host.",
)
@click.option("--record", is_flag=True, help="Store the measured figures in the bundle's manifest.")
@click.option(
    "--compare", nargs=2, type=click.Path(path_type=Path), help="Compare two saved results."
)
@json_option
def bench_command(
    bundle: Path | None,
    variant: str | None,
    threads: str | None,
    ctx: int | None,
    prompt_lengths: str,
    gen_tokens: int,
    repeats: int,
    warmup: int,
    meter: str | None,
    output: Path | None,
    calibrate: bool,
    record: bool,
    compare: tuple[Path, Path] | None,
    as_json: bool,
) -> None:
    """Measure load time, TTFT, prefill/decode tok/s, memory and watts of BUNDLE."""
    from edgekit.bench import bench
    from edgekit.bench_results import headline, load_result

    if compare:
        a, b = (load_result(p) for p in compare)
        ha, hb = headline(a), headline(b)
        rows = {k: (ha.get(k), hb.get(k)) for k in dict.fromkeys([*ha, *hb])}
        if as_json:
            emit_json({k: {"a": x, "b": y, "change_pct": _pct(x, y)} for k, (x, y) in rows.items()})
            return
        # a saved result is a file like any other: its names and file names are data
        t = Table(
            title=render.text(f"meters: A {a.meter.name}, B {b.meter.name}"),
            title_justify="left",
        )
        t.add_column("figure")
        t.add_column(render.text(f"A: {a.variant} ({compare[0].name})"))
        t.add_column(render.text(f"B: {b.variant} ({compare[1].name})"))
        t.add_column("B vs A")
        for k, (x, y) in rows.items():
            change = _pct(x, y)
            t.add_row(k, _fmt(x), _fmt(y), f"{change:+.1f}%" if change is not None else "-")
        render.console().print(t)
        return
    if bundle is None:
        raise click.UsageError("pass a BUNDLE to measure, or --compare A.json B.json")
    with progress_bars(disable=as_json) as on_progress:
        result = bench(
            bundle,
            variant=variant,
            threads=_ints(threads) or (None,),
            context=ctx,
            prompt_lengths=_ints(prompt_lengths),
            gen_tokens=gen_tokens,
            repeats=repeats,
            warmup=warmup,
            meter=meter,
            progress=on_progress,
        )
    data = result.to_dict()
    if output:
        write_atomic(output, json.dumps(data, indent=2))
    notes = _feed_back(result, calibrate=calibrate, record=record)
    if as_json:
        emit_json(data)
        return
    render_result(result, render.console())
    if result.thermal.throttled:
        err_console.print(
            render.line(
                ("warning:", "bold yellow"),
                " the CPU clock dropped or ran hot during the run: figures may be throttled",
            )
        )
    if output:
        err_console.print(render.text(f"saved {output}"))
    for note in notes:
        err_console.print(render.text(note))


def _feed_back(result: object, *, calibrate: bool, record: bool) -> list[str]:
    """Calibration sample and manifest figures from a result; what was written, in words."""
    from edgekit.bench import BenchResult
    from edgekit.bench_results import measured_figures, record_calibration
    from edgekit.bundle_open import update_variant
    from edgekit.probe import probe_host

    if not isinstance(result, BenchResult) or not result.runs:
        return []
    notes = []
    if calibrate:
        path = record_calibration(result, probe_host().profile)
        notes.append(f"calibration: this run now refines `edgekit plan --device host` ({path})")
    if record:
        update_variant(result.bundle, result.variant, measured=measured_figures(result))
        notes.append(f"recorded the measured figures of {result.variant} in {result.bundle}")
    return notes


def _pct(a: float | None, b: float | None) -> float | None:
    return 100 * (b - a) / a if a and b is not None else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def render_result(result: object, console: Console) -> None:
    from edgekit.bench import BenchResult

    if not isinstance(result, BenchResult):
        raise TypeError("a BenchResult")
    label = "a sensor" if result.meter.measured else "an estimate, no sensor here"
    caption = _power_caption(result)
    t = Table(
        "threads",
        "phase",
        "tokens",
        "tok/s median (range)",
        "TTFT s",
        "W avg/peak",
        "J/token",
        title=render.text(
            f"{result.variant} ({result.target} {result.quant}) - "
            f"power: {result.meter.name} ({label})"
        ),
        title_justify="left",
        caption=render.text(caption) if caption else None,
        caption_justify="left",
    )
    for run in result.runs:
        for p in run.prefill:
            t.add_row(
                str(run.threads),
                "prefill",
                str(p.prompt_tokens),
                _rate(p.tok_s),
                f"{p.ttft_s.median:.3f}",
                _watts(p.power.avg_w, p.power.peak_w),
                _fmt(p.joules_per_token),
            )
        d = run.decode
        t.add_row(
            str(run.threads),
            "decode",
            str(d.tokens),
            _rate(d.tok_s),
            "",
            _watts(d.power.avg_w, d.power.peak_w),
            _fmt(d.joules_per_token),
        )
        t.add_row(
            str(run.threads),
            "load",
            "",
            "",
            f"{run.load_s:.2f}",
            "",
            f"peak RSS {run.peak_rss_mb:.0f} MB",
        )
    console.print(t)


def _power_caption(result: object) -> str:
    """What the watts cover (a Jetson's rails) and the nvpmodel mode they were taken in."""
    from edgekit.bench import BenchResult

    if not isinstance(result, BenchResult):
        raise TypeError("a BenchResult")
    lines = []
    if result.thermal.power_mode:
        lines.append(f"power mode: {result.thermal.power_mode} (nvpmodel)")
    if result.meter.detail:
        lines.append(f"{result.meter.name}: {result.meter.detail}")
    return "\n".join(lines)


def _rate(s: object) -> str:
    from edgekit.bench import Spread

    if not isinstance(s, Spread):
        raise TypeError("a Spread")
    return f"{s.median:.0f} ({s.min:.0f}-{s.max:.0f})"


def _watts(avg: float | None, peak: float | None) -> str:
    return "-" if avg is None else f"{avg:.1f}/{peak:.1f}"
