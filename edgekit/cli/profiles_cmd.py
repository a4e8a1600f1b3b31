"""``edgekit profiles``: the device profiles shipped with edgekit."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from edgekit.cli import emit_json, json_option, main, render
from edgekit.devices import DeviceProfile, load_profile, profile_names


@main.group("profiles", invoke_without_command=True)
@json_option
@click.pass_context
def profiles_command(ctx: click.Context, as_json: bool) -> None:
    """List the device profiles (profiles show NAME for one)."""
    if ctx.invoked_subcommand is not None:
        return
    profiles = [load_profile(n) for n in profile_names()]
    if as_json:
        emit_json([p.to_dict() for p in profiles])
        return
    table = Table("device", "kind", "memory (usable)", "bandwidth", "power", "targets")
    table.columns[0].overflow = "fold"
    table.add_column("name", no_wrap=True)
    for p in profiles:
        table.add_row(
            render.name(p.display_name),
            render.name(p.kind),
            f"{p.memory.total_gib:g} GiB ({p.memory.usable_gib:g})",
            f"{p.memory.bandwidth_gbps:g} GB/s" if p.memory.bandwidth_gbps else "?",
            f"{p.power.typical_w:g}/{p.power.max_w:g} W",
            render.text(", ".join(p.targets)),
            render.name(p.name),
        )
    render.console().print(table)


@profiles_command.command("show")
@click.argument("name")
@json_option
def show_command(name: str, as_json: bool) -> None:
    """Show one profile by NAME (or a path to a profile .toml)."""
    profile = load_profile(name)
    if as_json:
        emit_json(profile.to_dict())
        return
    render_profile(profile, render.console())


def render_profile(p: DeviceProfile, console: Console) -> None:
    # A profile is a file anyone can write (or the probe's reading of this host): every
    # string in it is shown as one line of plain text.
    def row(key: str, value: str) -> None:
        t.add_row(render.name(key), render.text(value))

    title = render.text(f"{p.display_name} ({p.name})")
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    row("kind / os / arch", f"{p.kind} / {p.os} / {p.arch}")
    c = p.cpu
    cores = f"{c.physical_cores} physical, {c.logical_cores} logical"
    if c.performance_cores is not None:
        cores += f" ({c.performance_cores}P + {c.efficiency_cores or 0}E)"
    row("CPU", f"{c.model}: {cores}" + (f", {c.max_ghz:g} GHz" if c.max_ghz else ""))
    row("ISA", ", ".join(c.isa) or "unknown")
    m = p.memory
    mem = f"{m.total_gib:g} GiB total, {m.usable_gib:g} GiB usable by a model"
    if m.available_gib is not None:
        mem += f", {m.available_gib:g} GiB available now"
    row("memory", mem + (" (unified)" if m.unified else ""))
    if m.usable_note:
        row("", m.usable_note)
    bw = f"{m.bandwidth_gbps:g} GB/s ({m.bandwidth_source})" if m.bandwidth_gbps else "unknown"
    row("bandwidth", bw)
    for a in p.accelerators:
        peaks = ", ".join(f"{k} {v:g}" for k, v in a.peak_tops.items())
        extra = f", {a.memory_gib:g} GiB" if a.memory_gib else ""
        note = f" ({a.note})" if a.note else ""
        row(a.kind, f"{a.name}{extra}" + (f" - peak TOPS: {peaks}" if peaks else "") + note)
    pw = p.power
    row(
        "power",
        f"idle {pw.idle_w:g} W, typical {pw.typical_w:g} W, max {pw.max_w:g} W ({pw.source})",
    )
    for mode in pw.modes:
        default = " (default)" if mode.name == pw.default_mode else ""
        row("", f"mode {mode.name}: {mode.max_w:g} W, compute x{mode.compute_scale:g}{default}")
    row("targets", ", ".join(p.targets) or "none")
    row("power sensors", ", ".join(p.sensors) or "none")
    console.print(t)
