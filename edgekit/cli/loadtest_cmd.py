"""``edgekit loadtest URL``: load an OpenAI-compatible server, report throughput, latency
percentiles, errors and (from edgekit's own /metrics) energy per token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.errors import ServeError


def _numbers(flag: str, text: str | None, kind: type[int] | type[float]) -> tuple[Any, ...]:
    if not text:
        return ()
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ServeError(
            f"{flag} {text!r} is not a list of numbers",
            hint=f"pass numbers separated by commas, such as {flag} 1,2,4",
        ) from None


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
        concurrency=_numbers("--concurrency", concurrency, int),
        rates=_numbers("--rate", rate, float),
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


def _ms(spread: Any) -> str:
    if spread.n == 0:
        return "-"
    return f"{spread.p50 * 1e3:.0f} / {spread.p95 * 1e3:.0f} / {spread.p99 * 1e3:.0f}"


def _s(spread: Any) -> str:
    if spread.n == 0:
        return "-"
    return f"{spread.p50:.2f} / {spread.p95:.2f} / {spread.p99:.2f}"


def _energy(level: Any) -> str:
    e = level.energy
    if e is None or e.joules_per_token is None:
        return "-"
    mark = "" if e.measured else " (est.)"
    return f"{e.joules_per_token:.3f}{mark}"


def render_result(result: Any) -> None:
    t = Table(
        title=render.text(
            f"{result.url} {result.endpoint}, model {result.model}: prompts of about "
            f"{result.prompt_tokens} tokens, answers up to {result.max_tokens}"
        ),
        title_justify="left",
        caption="p50 / p95 / p99; out tok/s: all clients together; J/token from the "
        "server's /metrics (est.: an estimate, not a sensor)",
        caption_justify="left",
    )
    for column in ("level", "ok", "err", "req/s", "out tok/s", "TTFT ms", "ITL ms", "E2E s"):
        t.add_column(column, justify="left" if column == "level" else "right")
    t.add_column("J/token", justify="right")
    for level in result.levels:
        t.add_row(
            level.label(),
            str(level.ok),
            str(level.errors),
            f"{level.requests_per_s:.2f}",
            f"{level.output_tokens_per_s:.1f}",
            _ms(level.ttft_s),
            _ms(level.itl_s),
            _s(level.e2e_s),
            _energy(level),
        )
    console = render.console()
    console.print(t)
    for level in result.levels:
        for kind, n in level.error_kinds.items():
            console.print(render.line(f"{level.label()}: {n} x ", render.text(kind)))
    served = [lv.prompt_tokens_mean for lv in result.levels if lv.prompt_tokens_mean is not None]
    if served:
        console.print(
            render.text(
                f"the server counted {sum(served) / len(served):.0f} prompt tokens a request "
                f"(asked for about {result.prompt_tokens})"
            )
        )
