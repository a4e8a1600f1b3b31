"""``edgekit loadtest URL``: load an OpenAI-compatible server, report throughput, latency
percentiles, errors and (from edgekit's own /metrics) energy per token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.cli.loadtest_view import CAPTION, COLUMNS, level_cells, notes, numbers, title

if TYPE_CHECKING:
    from edgekit.loadtest_stats import LoadTestResult


@main.command("loadtest")
@click.argument("url")
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
    help="/v1/completions or /v1/chat/completions.",
)
@click.option("--model", help="The model to ask for (default: the first the server lists).")
@click.option("--api-key", envvar="EDGEKIT_API_KEY", help="Bearer token (or $EDGEKIT_API_KEY).")
@click.option("--concurrency", help="Clients at once, a sweep: 1,2,4,8 (default 1).")
@click.option("--rate", help="Open-loop arrivals in requests/s, a sweep: 0.5,1,2.")
@click.option(
    "--arrival",
    type=click.Choice(["poisson", "fixed"]),
    default="poisson",
    show_default=True,
    help="Open loop: Poisson arrivals (seeded) or a fixed interval.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--requests", default=32, show_default=True, type=int, help="At most, each level.")
@click.option(
    "--duration", default=60.0, show_default=True, type=float, help="Seconds at most, each level."
)
@click.option(
    "--prompt-tokens",
    default=128,
    show_default=True,
    type=int,
    help="Prompt length, in words of about one token each.",
)
@click.option("--max-tokens", default=64, show_default=True, type=int, help="Answer length.")
@click.option(
    "--timeout", default=120.0, show_default=True, type=float, help="Seconds for one request."
)
@click.option("--warmup", default=1, show_default=True, type=int, help="Requests not counted.")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Load a server beyond this machine (only one you run: this is a flood).",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Save the result JSON here.")
@json_option
def loadtest_command(
    url: str,
    endpoint: str,
    model: str | None,
    api_key: str | None,
    concurrency: str | None,
    rate: str | None,
    arrival: str,
    seed: int,
    requests: int,
    duration: float,
    prompt_tokens: int,
    max_tokens: int,
    timeout: float,
    warmup: int,
    allow_remote: bool,
    output: Path | None,
    as_json: bool,
) -> None:
    """Load the OpenAI-compatible server at URL (http://127.0.0.1:8000/v1) and report."""
    from edgekit.atomic import write_atomic
    from edgekit.loadtest import LoadPlan, run_loadtest, server_for

    plan = LoadPlan(
        url=url,
        endpoint="chat" if endpoint == "chat" else "completions",
        model=model,
        api_key=api_key,
        concurrency=numbers("--concurrency", concurrency, int),
        rates=numbers("--rate", rate, float),
        arrival="fixed" if arrival == "fixed" else "poisson",
        seed=seed,
        requests=requests,
        duration_s=duration,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        timeout_s=timeout,
        warmup=warmup,
        allow_remote=allow_remote,
    )
    server, local = server_for(plan)
    if not local:
        err_console.print(
            render.line(
                ("warning:", "bold yellow"),
                " loading ",
                render.name(server.host),
                ", which is not this machine (--allow-remote)",
            )
        )

    def progress(level: str) -> None:
        if not as_json:
            err_console.print(render.text(f"loading: {level}"))

    result = run_loadtest(plan, progress=progress)
    data = result.to_dict()
    if output:
        write_atomic(output, json.dumps(data, indent=2))
    if as_json:
        emit_json(data)
        return
    render_result(result)
    if output:
        err_console.print(render.text(f"saved {output}"))


def render_result(result: LoadTestResult) -> None:
    t = Table(
        title=render.text(title(result)),
        title_justify="left",
        caption=CAPTION,
        caption_justify="left",
    )
    for column in COLUMNS:
        t.add_column(column, justify="left" if column == "level" else "right")
    for level in result.levels:
        t.add_row(*level_cells(level))
    console = render.console()
    console.print(t)
    for line in notes(result):
        console.print(render.text(line))
