"""The ``edgekit`` command line: one verb per step of the data flow.

Library code raises edgekit errors; this layer renders them as one short screen on
stderr (or as JSON with ``--json``) and exits non-zero. Tracebacks appear only with -v.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, NoReturn

import click

from edgekit import __version__
from edgekit.atomic import interrupt_on_termination
from edgekit.cli.render import TEXT_MAX, SafeConsole, line, text
from edgekit.errors import EdgekitError
from edgekit.terminal_text import CleanLogRecords
from edgekit.untrusted import clean_text

# Resolves sys.stderr when it writes; never reads markup, never writes a control character.
err_console = SafeConsole(stderr=True)
log = logging.getLogger("edgekit")


OS_ERROR_HINT = "check the path and its permissions (-v shows where it failed)"


class EdgekitGroup(click.Group):
    """A click group that turns edgekit errors into a message, a hint and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EdgekitError as exc:
            _fail(ctx, exc.to_dict())
        except OSError as exc:
            # The file system refused a path the library did not check first (a name too
            # long, a permission): an error like any other, never a traceback with the
            # raw name in it.
            where = f"{exc.filename}: " if exc.filename is not None else ""
            message = f"{where}{exc.strerror or exc}"
            _fail(ctx, {"error": type(exc).__name__, "message": message, "hint": OS_ERROR_HINT})
        except click.ClickException as exc:
            # click's own messages quote what was typed or globbed: a path that does not
            # exist, an unknown command. Clean them before click shows them.
            # (click types these attributes Final; the exception is about to be shown)
            setattr(exc, "message", clean_text(exc.message, max_len=TEXT_MAX))  # noqa: B010
            if isinstance(exc, click.FileError):
                setattr(exc, "ui_filename", clean_text(exc.ui_filename, max_len=TEXT_MAX))  # noqa: B010
            raise


def _fail(ctx: click.Context, error: dict[str, str]) -> NoReturn:
    """Show an error (``{"error", "message", "hint"}``) and exit 1: JSON on stdout with
    --json (exact: JSON escapes what it must), and on stderr one clean line for the
    message and one for the hint, whose paths and names come from files."""
    sub = ctx.obj or {}
    if sub.get("verbose"):
        err_console.print_exception()
    if sub.get("json"):
        click.echo(json.dumps(error, indent=2))
    err_console.print(line(("error:", "bold red"), " ", text(error["message"])))
    if error["hint"]:
        err_console.print(line(("hint:", "bold"), " ", text(error["hint"])))
    sys.exit(1)


@click.group(cls=EdgekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgekit")
@click.option(
    "-v", "--verbose", count=True, help="More logging (-vv for debug); tracebacks on errors."
)
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """Put language models on edge devices: inspect, probe, plan, pack, run, bench."""
    # SIGTERM/SIGHUP unwind like Ctrl-C, so atomic outputs remove their temporary folders.
    interrupt_on_termination()
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, handlers=[log_handler()])


def log_handler() -> logging.Handler:
    """The CLI's log handler: stderr, one line a record, every record cleaned of control
    characters (a record's arguments are names and paths from files)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(CleanLogRecords())
    return handler


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
    loadtest_cmd,
    plan_cmd,
    probe_cmd,
    profiles_cmd,
    run_cmd,
    tools_cmd,
    tui_cmd,
)
