"""``edgekit run``, ``edgekit chat`` and ``edgekit serve``: use a bundle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.terminal_text import OutputCleaner


def _load(
    bundle: Path,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
    parallel: int | None = None,
) -> Any:
    import edgekit
    from edgekit.cli.progress import progress_bars

    settings: dict[str, Any] = {}
    if context:
        settings["context"] = context
    if threads:
        settings["threads"] = threads
    if parallel is not None and parallel > 1:  # 1: the single-stream session
        settings["parallel"] = parallel
    # bars on stderr while loading (a TensorRT engine is built on the first load: minutes),
    # and what the load did that a user should know (an engine built, and why)
    with progress_bars() as progress:
        session = edgekit.load(
            bundle, variant=variant, device=device, force=force, progress=progress, **settings
        )
    _say_engine(session)
    return session


def _load_to_serve(
    bundle: Path,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
    parallel: int | None,
    queue_size: int,
) -> Any:
    """The session ``serve`` runs: ``parallel`` streams, or the plan's when not given; the
    plan's fall back to one at a time when they no longer fit, or the variant's settings
    rule batching out (a quantized KV cache the target's batch lacks), saying why."""
    from edgekit.errors import BatchSettingError, InsufficientMemoryError

    planned = parallel is None
    if planned:  # the plan's: the streams whose KV caches fit beside the weights
        parallel = _planned_parallel(bundle, variant, device, context, queue_size)
    try:
        return _load(bundle, variant, device, context, threads, force, parallel)
    except (InsufficientMemoryError, BatchSettingError) as exc:
        if not planned or not parallel or parallel <= 1:
            raise
        why = (
            "no longer fit"
            if isinstance(exc, InsufficientMemoryError)
            else f"cannot run together here ({exc.message})"
        )
        err_console.print(
            render.text(f"note: {parallel} streams {why}; serving one at a time", "dim")
        )
        return _load(bundle, variant, device, context, threads, force, None)


def _planned_parallel(
    bundle: Path, variant: str | None, device: str, context: int | None, queue_size: int
) -> int | None:
    """The streams the plan fits in the memory free now (up to 8 and the queue), or None
    when it cannot tell: load then says why the bundle cannot be used."""
    from edgekit.errors import EdgekitError
    from edgekit.runtime import suggest_parallel

    try:
        return min(suggest_parallel(bundle, variant, device, context=context), queue_size)
    except EdgekitError:
        return None


def _say_engine(session: Any) -> None:
    """One stderr line when the load built an engine, with the reason (first build, a new
    TensorRT, changed settings): a user sees why this load took minutes."""
    settings = getattr(getattr(session, "info", None), "settings", None)
    if isinstance(settings, dict) and settings.get("engine_built"):
        err_console.print(render.text(f"engine built: {settings.get('engine_reason', '')}", "dim"))


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
    from edgekit.targets.values import Sampling

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
        shown = OutputCleaner()  # the terminal gets the text without escape sequences
        for chunk in session.stream(prompt, sampling):
            if first is None and chunk.tokens:
                first = time.perf_counter()
            if not as_json:
                click.echo(shown.feed(chunk.text), nl=False)
            pieces.append(chunk.text)  # --json keeps the text exactly as generated
            tokens += chunk.tokens
            reason = chunk.finish_reason or reason
        if not as_json:
            click.echo(shown.flush(), nl=False)
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
            render.line(
                render.name(session.variant.name, "dim"),
                (f": {tokens} tokens, {reason}, {rate:.1f} tok/s after the first", "dim"),
            )
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
    console = render.console()
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    with _load(bundle, variant, device, context, threads, force) as session:
        _check_chat_template(session, bundle)
        console.print(
            render.line(render.name(session.variant.name, "dim"), (" loaded; /reset, /exit", "dim"))
        )
        while True:
            try:
                line = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
            except (EOFError, click.Abort):
                break
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip() == "/reset":
                history = history[:1] if system else []
                console.print("history cleared", style="dim")
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            reply = []
            shown = OutputCleaner()  # the terminal gets the text without escape sequences
            for chunk in session.chat_stream(history, sampling):
                click.echo(shown.feed(chunk.text), nl=False)
                reply.append(chunk.text)  # the history keeps what the model said
            click.echo(shown.flush())
            history.append({"role": "assistant", "content": "".join(reply)})


def _check_chat_template(session: Any, bundle: Path) -> None:
    """Refuse ``chat`` before the first message when the model has no chat template: the
    way to use such a model from the command line is ``edgekit run`` with a prompt.

    Raises:
        GenerationError: the bundle's manifest records no chat template.
    """
    import shlex

    from edgekit.errors import GenerationError

    if session.bundle.manifest.tokenizer.chat_template is None:
        raise GenerationError(
            f"{session.bundle.manifest.name} has no chat template: `edgekit chat` needs one "
            "to turn messages into a prompt",
            hint=f"generate from a plain prompt instead: edgekit run {shlex.quote(str(bundle))} "
            "-p 'your text'",
        )


@main.command("serve")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Bind address. Beyond loopback (0.0.0.0, a LAN address) it needs --api-key.",
)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option(
    "--api-key", envvar="EDGEKIT_API_KEY", help="Require this bearer token (or $EDGEKIT_API_KEY)."
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve beyond loopback without an API key: anyone who can reach the port can use it.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also accept requests whose Host is NAME (a DNS name for this machine; repeatable). "
    "IP addresses and localhost are always accepted.",
)
@click.option(
    "--allow-origin",
    "allow_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let web pages of ORIGIN (e.g. http://localhost:3000) call the API, with CORS "
    "headers (repeatable; * for any). Other pages are refused.",
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
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    help="Generations decoded together in one batch (continuous batching; 1: one at a "
    "time). Each holds its own KV cache of the context. Default: as many as the plan fits "
    "in the memory free now, up to 8 and --queue-size, where the variant's target batches.",
)
@load_options
def serve_command(
    bundle: Path,
    host: str,
    port: int,
    api_key: str | None,
    insecure_no_auth: bool,
    allow_hosts: tuple[str, ...],
    allow_origins: tuple[str, ...],
    max_tokens_limit: int,
    max_request_bytes: int,
    queue_size: int,
    parallel: int | None,
    variant: str | None,
    device: str,
    context: int | None,
    threads: int | None,
    force: bool,
) -> None:
    """Serve BUNDLE over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)."""
    from dataclasses import replace

    import edgekit.serve
    from edgekit.errors import ServeError
    from edgekit.serve_config import ServeConfig, is_loopback

    if parallel is not None and queue_size < parallel:
        raise click.UsageError(
            f"--queue-size {queue_size} is smaller than --parallel {parallel}: the slots could "
            "never all be used"
        )
    try:  # refused before the model is loaded: an open server is never started by mistake
        config = ServeConfig(
            model_name="",
            host=host,
            port=port,
            api_key=api_key,
            insecure_no_auth=insecure_no_auth,
            allow_hosts=allow_hosts,
            allow_origins=allow_origins,
            max_tokens_limit=max_tokens_limit,
            max_request_bytes=max_request_bytes,
            queue_size=queue_size,
        )
    except ServeError as exc:
        raise click.UsageError(str(exc)) from exc
    if api_key is None and not is_loopback(host):
        err_console.print(
            render.line(
                ("warning:", "bold yellow"),
                f" serving on {host}:{port} without an API key (--insecure-no-auth): anyone "
                "who can reach this port can use the model",
            )
        )
    session = _load_to_serve(bundle, variant, device, context, threads, force, parallel, queue_size)
    with session:
        name = session.bundle.manifest.name
        err_console.print(
            render.line(
                "serving ",
                render.name(name),
                " (",
                render.name(session.variant.name),
                f") on http://{host}:{port}/v1",
                f", {session.parallel} generations at once" if session.parallel > 1 else "",
            )
        )
        edgekit.serve.serve(session, replace(config, model_name=name))
