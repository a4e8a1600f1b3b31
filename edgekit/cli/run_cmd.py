"""``edgekit run``, ``edgekit chat`` and ``edgekit serve``: use a bundle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from edgekit.cli import emit_json, err_console, json_option, main


def _load(
    bundle: Path,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
) -> Any:
    import edgekit

    settings: dict[str, Any] = {}
    if context:
        settings["context"] = context
    if threads:
        settings["threads"] = threads
    return edgekit.load(bundle, variant=variant, device=device, force=force, **settings)


def load_options(f: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--variant", help="Variant to load (default: the best this host can run)."
            ),
            click.option("--device", default="auto", show_default=True, help="auto, cpu or gpu."),
            click.option("--context", type=int, help="Context length (default: the bundle's)."),
            click.option("--threads", type=int, help="Threads (default: physical cores)."),
            click.option(
                "--force", is_flag=True, help="Load even if predicted not to fit in memory."
            ),
        ]
    ):
        f = option(f)
    return f


def sampling_options(f: Any) -> Any:
    for option in reversed(
        [
            click.option("--max-tokens", type=int, default=256, show_default=True),
            click.option("--temperature", type=float, default=0.8, show_default=True),
            click.option("--top-p", type=float, default=0.95, show_default=True),
            click.option("--seed", type=int),
            click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        ]
    ):
        f = option(f)
    return f


def _sampling(
    max_tokens: int, temperature: float, top_p: float, seed: int | None, stop: tuple[str, ...]
) -> Any:
    from edgekit.targets.base import Sampling

    return Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop
    )


@main.command("run")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-p", "--prompt", required=True, help="The prompt.")
@load_options
@sampling_options
@json_option
def run_command(
    bundle: Path,
    prompt: str,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: tuple[str, ...],
    as_json: bool,
) -> None:
    """Generate from PROMPT with BUNDLE, streaming to the terminal."""
    sampling = _sampling(max_tokens, temperature, top_p, seed, stop)
    with _load(bundle, variant, device, context, threads, force) as session:
        start = time.perf_counter()
        first: float | None = None
        pieces, tokens, reason = [], 0, "length"
        for chunk in session.stream(prompt, sampling):
            if first is None and chunk.tokens:
                first = time.perf_counter()
            if not as_json:
                click.echo(chunk.text, nl=False)
            pieces.append(chunk.text)
            tokens += chunk.tokens
            reason = chunk.finish_reason or reason
        elapsed = time.perf_counter() - start
        if as_json:
            emit_json(
                {
                    "variant": session.variant.name,
                    "text": "".join(pieces),
                    "completion_tokens": tokens,
                    "finish_reason": reason,
                    "seconds": round(elapsed, 3),
                }
            )
            return
        click.echo()
        rate = (
            (tokens - 1) / (elapsed - (first - start))
            if first and tokens > 1 and elapsed > first - start
            else 0
        )
        err_console.print(
            f"[dim]{session.variant.name}: {tokens} tokens, {reason}, "
            f"{rate:.1f} tok/s after the first[/]",
            highlight=False,
        )


@main.command("chat")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--system", help="A system message.")
@load_options
@sampling_options
def chat_command(
    bundle: Path,
    system: str | None,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    stop: tuple[str, ...],
) -> None:
    """Chat with BUNDLE in the terminal (/reset clears the history, /exit or Ctrl-D leaves)."""
    sampling = _sampling(max_tokens, temperature, top_p, seed, stop)
    console = Console()
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    with _load(bundle, variant, device, context, threads, force) as session:
        console.print(f"[dim]{session.variant.name} loaded; /reset, /exit[/]", highlight=False)
        while True:
            try:
                line = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
            except (EOFError, click.Abort):
                break
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip() == "/reset":
                history = history[:1] if system else []
                console.print("[dim]history cleared[/]")
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            reply = []
            for chunk in session.chat_stream(history, sampling):
                click.echo(chunk.text, nl=False)
                reply.append(chunk.text)
            click.echo()
            history.append({"role": "assistant", "content": "".join(reply)})


@main.command("serve")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Bind address (0.0.0.0 exposes it)."
)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--api-key", envvar="EDGEKIT_API_KEY", help="Require this bearer token (or $EDGEKIT_API_KEY)."
)
@click.option("--max-tokens-limit", default=4096, show_default=True, type=int)
@click.option("--max-request-bytes", default=1 << 20, show_default=True, type=int)
@click.option(
    "--queue-size",
    default=8,
    show_default=True,
    type=int,
    help="Requests waiting or running before 503.",
)
@load_options
def serve_command(
    bundle: Path,
    host: str,
    port: int,
    api_key: str | None,
    max_tokens_limit: int,
    max_request_bytes: int,
    queue_size: int,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
) -> None:
    """Serve BUNDLE over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)."""
    from edgekit.serve import ServeConfig, serve

    with _load(bundle, variant, device, context, threads, force) as session:
        name = session.bundle.manifest.name
        err_console.print(
            f"serving {name} ({session.variant.name}) on http://{host}:{port}/v1", highlight=False
        )
        serve(
            session,
            ServeConfig(
                model_name=name,
                host=host,
                port=port,
                api_key=api_key,
                max_tokens_limit=max_tokens_limit,
                max_request_bytes=max_request_bytes,
                queue_size=queue_size,
            ),
        )
