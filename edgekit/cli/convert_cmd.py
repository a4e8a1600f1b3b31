"""``edgekit convert``: between Hugging Face folders and GGUF, quantizing on the way."""

from __future__ import annotations

from pathlib import Path

import click

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.cli.progress import progress_bars


@main.command("convert")
@click.argument("src", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "to",
    type=click.Choice(["gguf", "openvino", "hf"]),
    required=True,
    help="Output format.",
)
@click.option(
    "--quant",
    help="GGUF: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, ... (default F16); "
    "OpenVINO: F16, INT8, INT4, INT4_SYM (default INT4).",
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
    """Convert SRC (a Hugging Face folder or a .gguf file) to GGUF or to a Hugging Face folder."""
    from edgekit.converters.convert import convert_model

    with progress_bars(disable=as_json) as on_progress:
        result = convert_model(
            src,
            "hf" if to == "hf" else "openvino" if to == "openvino" else "gguf",
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
