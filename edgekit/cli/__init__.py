"""The ``edgekit`` command line: one verb per step of the data flow.

Library code raises edgekit errors; this layer renders them as one short screen on
stderr (or as JSON with ``--json``) and exits non-zero. Tracebacks appear only with -v.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click
from rich.console import Console

from edgekit import __version__
from edgekit.errors import EdgekitError

err_console = Console(stderr=True)
log = logging.getLogger("edgekit")


class EdgekitGroup(click.Group):
    """A click group that turns edgekit errors into a message, a hint and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EdgekitError as exc:
            sub = ctx.obj or {}
            if sub.get("verbose"):
                err_console.print_exception()
            if sub.get("json"):
                click.echo(json.dumps(exc.to_dict(), indent=2))
            err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
            if exc.hint:
                err_console.print(f"[bold]hint:[/] {exc.hint}", highlight=False)
            sys.exit(1)


@click.group(cls=EdgekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgekit")
@click.option(
    "-v", "--verbose", count=True, help="More logging (-vv for debug); tracebacks on errors."
)
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """Put language models on edge devices: inspect, probe, plan, pack, run, bench."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def json_option(f: Any) -> Any:
    """``--json``: print one JSON document on stdout instead of tables."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
        ctx.ensure_object(dict)
        ctx.obj["json"] = value
        return value

    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=remember,
        expose_value=True,
        is_eager=True,
        help="Print JSON for scripts instead of tables.",
    )(f)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# Commands register themselves on ``main`` when their modules are imported.
from edgekit.cli import (  # noqa: E402,F401
    bench_cmd,
    bundle_cmd,
    convert_cmd,
    eval_cmd,
    inspect_cmd,
    plan_cmd,
    probe_cmd,
    profiles_cmd,
    run_cmd,
    tui_cmd,
)
