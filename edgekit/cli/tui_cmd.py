"""``edgekit tui``: the terminal UI (Device, Plan, Bench, Compare, Chat, Load)."""

from __future__ import annotations

from pathlib import Path

import click

from edgekit.cli import main


@main.command("tui")
@click.argument("target", required=False, type=click.Path(path_type=Path, exists=True))
@click.option(
    "--device",
    "-d",
    default="host",
    show_default=True,
    help="The device the Plan tab plans for (a profile name or host).",
)
@click.option(
    "--results",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder of saved bench results for the Compare tab [default: the cache's results/].",
)
@click.option(
    "--load-url",
    help="The server the Load tab loads [default: where `edgekit serve` listens, "
    "http://127.0.0.1:8000/v1].",
)
@click.option(
    "--api-key", envvar="EDGEKIT_API_KEY", help="The Load tab's bearer token (or $EDGEKIT_API_KEY)."
)
def tui_command(
    target: Path | None,
    device: str,
    results: Path | None,
    load_url: str | None,
    api_key: str | None,
) -> None:
    """Open the terminal UI on MODEL_OR_BUNDLE (default: the embedded default model).

    A bundle feeds the Bench and Chat tabs; a model feeds the Plan tab (and can be packed
    for this host from the Bench tab). The Load tab load-tests an OpenAI-compatible
    server. Keys: d p b c h l switch tabs, q quits.
    """
    try:
        from edgekit.tui.app import run_app
        from edgekit.tui.sources import Sources
    except ImportError as exc:
        raise click.ClickException(
            f"the TUI needs textual ({exc.name} is missing): pip install 'edgekit[tui]'"
        ) from exc
    extra: dict[str, object] = {"results": results} if results is not None else {}
    if load_url is not None:
        extra["load_url"] = load_url
    run_app(Sources.from_argument(target, device=device, api_key=api_key, **extra))
