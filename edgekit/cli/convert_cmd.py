"""``edgekit convert``: a model to any format edgekit builds, or a GGUF back to a Hugging
Face folder, quantizing on the way. The outputs and their quantizations come from the
conversion graph (the registered formats' edges)."""

from __future__ import annotations

from pathlib import Path

import click

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.cli.progress import progress_bars
from edgekit.converters import graph
from edgekit.converters.convert import convert_model
from edgekit.targets.registry import get_format


class _Outputs(click.Choice[str]):
    """The conversion graph's outputs, read when the command runs (the registry may
    gain a plug-in after this module is imported)."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return graph.outputs()

    @choices.setter
    def choices(self, _value: object) -> None:
        """Choice's constructor sets the list; the graph is the list."""


class _QuantOption(click.Option):
    """--quant, whose help lists each output format's quantizations when it is shown
    (importing the CLI loads no plug-in)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = _quant_help()
        return super().get_help_record(ctx)


def _quant_help() -> str:
    """Each output format's quantizations and default, from its format package."""
    parts = []
    for name in graph.outputs():
        if name == graph.HF:
            continue
        fmt = get_format(name)
        quants = ", ".join(q.name for q in fmt.quants.values())
        parts.append(f"{fmt.display}: {quants} (default {fmt.default_quant})")
    return "; ".join(parts) + "."


@main.command("convert")
@click.argument("src", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "to",
    type=_Outputs(),
    required=True,
    help="Output format.",
)
@click.option(
    "--quant",
    cls=_QuantOption,
    help="The output's quantization.",
)
@click.option(
    "-o", "--output", "out", type=click.Path(path_type=Path), required=True, help="Output path."
)
@click.option(
    "--recipe",
    help="Recipe options: embeddings=Q8_0, output=Q8_0, kv_cache=q8_0, group_size=64, ratio=0.8, "
    "calibration=FILE (comma-separated).",
)
@click.option(
    "--tokenizer-pre", help="llama.cpp pre-tokenizer name, when edgekit cannot detect it."
)
@click.option("--threads", type=int, help="Quantization threads (default: physical cores).")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@json_option
def convert_command(
    src: Path,
    to: str,
    quant: str | None,
    out: Path,
    recipe: str | None,
    tokenizer_pre: str | None,
    threads: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Convert SRC (a Hugging Face folder or a .gguf file) to another format, or a GGUF to a
    Hugging Face folder."""
    with progress_bars(disable=as_json) as on_progress:
        result = convert_model(
            src,
            to,
            out,
            quant=quant,
            recipe=recipe,
            tokenizer_pre=tokenizer_pre,
            threads=threads,
            force=force,
            progress=on_progress,
        )
    if as_json:
        emit_json(
            {
                "path": str(result.path),
                "format": result.format,
                "quant": result.quant,
                "seconds": round(result.seconds, 3),
                "warnings": list(result.warnings),
            }
        )
        return
    for w in result.warnings:
        err_console.print(render.line(("warning:", "bold yellow"), " ", render.text(w)))
    render.console().print(
        render.text(
            f"wrote {result.path} ({result.format}{' ' + result.quant if result.quant else ''}) "
            f"in {result.seconds:.1f} s"
        )
    )
