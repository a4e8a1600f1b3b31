"""``edgekit eval``: perplexity, KL divergence and agreement of a variant against a reference."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click
from rich.table import Table

from edgekit.cli import emit_json, json_option, main, render
from edgekit.cli.progress import progress_bars


@main.command("eval")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--variant", help="Variant to evaluate (default: the one load() picks).")
@click.option(
    "--reference",
    required=True,
    help="The source model (HF folder or .gguf) or another variant's name.",
)
@click.option(
    "--text",
    "text_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Evaluation text (default: the shipped Austen excerpt).",
)
@click.option("--ctx", default=512, show_default=True, type=int, help="Window length in tokens.")
@click.option("--chunks", default=8, show_default=True, type=int, help="Windows to score (0: all).")
@click.option(
    "--record", is_flag=True, help="Store the result in the manifest and the quality table."
)
@json_option
def eval_command(
    bundle: Path,
    variant: str | None,
    reference: str,
    text_file: Path | None,
    ctx: int,
    chunks: int,
    record: bool,
    as_json: bool,
) -> None:
    """Compare BUNDLE's variant with a reference on the same tokens."""
    from edgekit.evaluation import eval_bundle

    with progress_bars(disable=as_json) as on_progress:
        name, result = eval_bundle(
            bundle,
            variant=variant,
            reference=reference,
            text_file=text_file,
            ctx=ctx,
            chunks=chunks or None,
            record=record,
            progress=on_progress,
        )
    if as_json:
        emit_json({"variant": name, "reference": reference, **asdict(result)})
        return
    t = Table(show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row(
        "perplexity", f"{result.perplexity:.3f} (reference {result.reference_perplexity:.3f})"
    )
    t.add_row("KL divergence", f"mean {result.kl_mean:.5f}, p99 {result.kl_p99:.5f} nats/token")
    t.add_row("top-1 agreement", f"{result.top1_agreement:.4f}")
    t.add_row(
        "scored",
        f"{result.tokens_scored} tokens: second halves of {result.chunks} windows of {result.ctx}",
    )
    console = render.console()
    # names from the manifest and the command line: a line of their own above the table
    console.print(render.line(render.name(name), " against ", render.name(reference)))
    console.print(t)
