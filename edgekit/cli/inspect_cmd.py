"""``edgekit inspect``: a model's structure from its headers."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgekit.cli import emit_json, json_option, main, render
from edgekit.default_model import default_model_path
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec

GB = 1e9


@main.command("inspect")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option("--tensors", is_flag=True, help="List every tensor with its shape and dtype.")
@json_option
def inspect_command(model: Path | None, tensors: bool, as_json: bool) -> None:
    """Describe MODEL (a Hugging Face folder or a .gguf file) without loading weights.

    Without MODEL, inspects the embedded default model (SmolLM2-135M-Instruct).
    """
    spec = inspect_model(model if model is not None else default_model_path())
    if as_json:
        emit_json(spec.to_dict(with_tensors=True))
        return
    render_spec(spec, render.console(), with_tensors=tensors)


def render_spec(spec: ModelSpec, console: Console, *, with_tensors: bool) -> None:
    # Everything the model's files name (its name, architecture, tokenizer, tensor names
    # and dtypes) is data: plain Text, one line each.
    title = render.name(spec.name or spec.path)
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    source = "from tensor headers" if spec.parameters_source == "tensors" else "derived from config"
    rows: list[tuple[str, str | Text]] = [
        ("path", render.text(spec.path)),
        ("format", render.name(spec.format)),
        ("family / architecture", render.name(f"{spec.family} / {spec.architecture}")),
        ("parameters", f"{spec.parameters:,} ({spec.parameters / 1e6:.1f}M, {source})"),
        ("weights", render.name(f"{spec.weight_bytes / GB:.3f} GB as {spec.dtype}")),
        ("layers", str(spec.layers)),
        ("hidden size", str(spec.hidden_size)),
        ("heads / KV heads / head dim", f"{spec.heads} / {spec.kv_heads} / {spec.head_dim}"),
        ("FFN size", str(spec.ffn_size)),
        ("vocabulary", f"{spec.vocab_size:,}"),
        ("context length", f"{spec.context_length:,}"),
        ("tied embeddings", "yes" if spec.tied_embeddings else "no"),
        ("sliding window", str(spec.sliding_window) if spec.sliding_window else "none"),
        ("tokenizer", render.name(spec.tokenizer or "none found")),
        ("chat template", "yes" if spec.chat_template else "no"),
        ("KV cache per token (f16)", f"{spec.kv_bytes_per_token_f16:,} bytes"),
        ("tensors", str(len(spec.tensors))),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if with_tensors:
        t = Table("tensor", "shape", "dtype", "bytes")
        for info in spec.tensors:
            shape = "x".join(map(str, info.shape))
            t.add_row(render.name(info.name), shape, render.name(info.dtype), f"{info.nbytes:,}")
        console.print(t)
