"""``edgekit probe``: this host as a device profile."""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import emit_json, json_option, main, render
from edgekit.cli.profiles_cmd import render_profile
from edgekit.probe import probe_host


@main.command("probe")
@click.option("--measure", is_flag=True, help="Also measure memory bandwidth (about a second).")
@json_option
def probe_command(measure: bool, as_json: bool) -> None:
    """Describe this host: CPU, memory, accelerators, power sensors, usable targets."""
    report = probe_host(measure=measure)
    if as_json:
        emit_json(report.to_dict())
        return
    console = render.console()
    render_profile(report.profile, console)
    sensors = Table(
        "power sensor", "readable", "detail", title="Power sensors", title_justify="left"
    )
    for s in report.sensors:
        sensors.add_row(render.name(s.name), "yes" if s.readable else "no", render.text(s.detail))
    console.print(sensors)
    targets = Table(
        "target", "installed", "usable", "version", "detail", title="Targets", title_justify="left"
    )
    for t in report.targets:
        targets.add_row(
            render.name(t.name),
            "yes" if t.installed else "no",
            "yes" if t.usable else "no",
            render.name(t.version or "-"),
            render.text(t.detail),
        )
    console.print(targets)
    failed = [p for p in report.parts if not p.ok]
    for part in failed:
        console.print(render.text(f"{part.name}: {part.detail}", "dim"))
