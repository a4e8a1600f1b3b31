"""``edgekit tools``: the isolated tool environments conversions run in.

A format whose exporter cannot share edgekit's environment declares one
(``Format.tool_envs``); ``tools list`` shows each with whether it is ready, and
``tools install NAME`` creates it (instant when it is ready already).
"""

from __future__ import annotations

import click
from rich.table import Table

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.errors import TargetUnavailableError
from edgekit.progress import ProgressEvent
from edgekit.targets.registry import all_formats
from edgekit.tool_envs import ToolEnv, install, status


def declared() -> dict[str, ToolEnv]:
    """Every tool environment a registered format declares, by name."""
    return {env.name: env for fmt in all_formats() for env in fmt.tool_envs}


@main.group("tools", invoke_without_command=True)
@json_option
@click.pass_context
def tools_command(ctx: click.Context, as_json: bool) -> None:
    """The tool environments conversions run in (tools list, tools install NAME)."""
    if ctx.invoked_subcommand is None:
        _list(as_json)


@tools_command.command("list")
@json_option
def list_command(as_json: bool) -> None:
    """List the tool environments and whether each is installed."""
    _list(as_json)


def _list(as_json: bool) -> None:
    envs = declared()
    found = [(env, status(env)) for env in envs.values()]
    if as_json:
        emit_json([{**s.to_json(), "description": env.description} for env, s in found])
        return
    table = Table("name", "ready", "path", "what")
    for env, s in found:
        table.add_row(
            render.name(env.name),
            "yes" if s.ready else render.text(f"no: {s.reason}"),
            render.text(str(s.path)),
            render.text(env.description),
        )
    render.console().print(table)


@tools_command.command("install")
@click.argument("name")
@click.option("--force", is_flag=True, help="Reinstall even when it is ready.")
@json_option
def install_command(name: str, force: bool, as_json: bool) -> None:
    """Create the tool environment NAME (pip downloads; a minute or more)."""
    envs = declared()
    env = envs.get(name)
    if env is None:
        raise TargetUnavailableError(
            f"no tool environment {name!r}",
            hint=f"choose one of {', '.join(envs) or '(none declared)'}",
        )

    def on_progress(event: ProgressEvent) -> None:
        err_console.print(render.line(("tools:", "bold"), " ", render.text(event.detail)))

    result = install(env, force=force, progress=on_progress)
    if as_json:
        emit_json({**result.to_json(), "description": env.description})
        return
    render.console().print(
        render.line(render.name(env.name), " ready at ", render.text(str(result.path)))
    )
