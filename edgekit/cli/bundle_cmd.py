"""``edgekit pack`` and ``edgekit verify``: write and check bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from edgekit.cli import emit_json, err_console, json_option, main, render
from edgekit.cli.progress import progress_bars
from edgekit.manifest import Manifest


class _RegistryDefault(click.Option):
    """An option whose default is the registry's default target, looked up only when it
    is needed (help, or a pack without --target): listing the targets imports them."""

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        from edgekit.targets.registry import default_target

        return default_target().name

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from edgekit.errors import TargetError

        try:
            self.show_default = str(self.get_default(ctx))
        except TargetError:  # no runnable target installed: help still shows
            self.show_default = "none installed"
        return super().get_help_record(ctx)


@main.command("pack")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option("--target", cls=_RegistryDefault, help="Runtime target of the variants.")
@click.option(
    "--quant",
    help="Quantization [default: the target format's pack default, e.g. Q4_K_M for GGUF]; "
    "several, comma-separated, make several variants, each optionally TARGET:QUANT for "
    "another target than --target (Q4_K_M,Q8_0,TARGET:INT4).",
)
@click.option(
    "--device",
    "-d",
    help="Let the planner pick target and format for this device profile (or host); see "
    "edgekit plan. The budgets below apply.",
)
@click.option("--memory", help="With --device: memory budget, e.g. 6GB.")
@click.option("--power", help="With --device: power budget, e.g. 10W.")
@click.option("--min-tps", type=float, help="With --device: slowest acceptable decode, tok/s.")
@click.option("--recipe", help="Recipe options for every variant: embeddings=Q8_0,kv_cache=q8_0.")
@click.option(
    "--context", type=int, help="Context length the runtime uses (default: min(model, 4096))."
)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True)
@click.option("--name", help="Bundle name (default: the output's name).")
@click.option("--archive", is_flag=True, help="Write one .tar file instead of a folder.")
@click.option(
    "--max-quality-loss",
    type=float,
    help="Largest mean KL divergence (nats/token) against MODEL a variant may measure.",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@json_option
def pack_command(
    model: Path | None,
    target: str,
    quant: str | None,
    device: str | None,
    memory: str | None,
    power: str | None,
    min_tps: float | None,
    recipe: str | None,
    context: int | None,
    out: Path,
    name: str | None,
    archive: bool,
    max_quality_loss: float | None,
    force: bool,
    as_json: bool,
) -> None:
    """Convert MODEL into a deployable bundle (default: the embedded default model)."""
    from edgekit.bundle import VariantRequest, pack
    from edgekit.default_model import default_model_path

    requests = []
    source = model or default_model_path()
    if device is not None:
        if quant is not None:
            raise click.UsageError("pass --quant or --device, not both")
        from edgekit.cli.plan_cmd import budgets_from, render_plan
        from edgekit.converters.planner import plan_for

        budgets = budgets_from(memory, power, context, min_tps, max_quality_loss, "f16")
        planned = plan_for(source, device, budgets)
        if not as_json:
            render_plan(planned, render.console(stderr=True))
        requests += VariantRequest.for_device(planned, recipe=recipe)
        max_quality_loss = None  # the plan held the formats to it; no second evaluation
    if not quant and device is None:  # the request's default quantization
        requests.append(VariantRequest(target=target, recipe=recipe, context=context))
    for item in (q.strip() for q in (quant or "").split(",")):
        if item:
            variant_target, _, variant_quant = item.rpartition(":")
            requests.append(
                VariantRequest(
                    target=variant_target or target,
                    quant=variant_quant,
                    recipe=recipe,
                    context=context,
                )
            )
    with progress_bars(disable=as_json) as on_progress:
        result = pack(
            source,
            out,
            requests,
            name=name,
            archive=archive,
            force=force,
            max_quality_loss=max_quality_loss,
            progress=on_progress,
        )
    if as_json:
        emit_json(
            {
                "path": str(result.path),
                "variants": [v.name for v in result.manifest.variants],
                "warnings": list(result.warnings),
            }
        )
        return
    for w in result.warnings:
        err_console.print(render.line(("warning:", "bold yellow"), " ", render.text(w)))
    render_variants(result.manifest, render.console(), title=f"packed {result.path}")


@main.command("verify")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--fast", is_flag=True, help="Sizes only, no checksums.")
@json_option
def verify_command(bundle: Path, fast: bool, as_json: bool) -> None:
    """Check a bundle's manifest, file sizes and sha256 checksums."""
    from edgekit.bundle_open import open_bundle, verify_bundle

    opened = open_bundle(bundle)
    verify_bundle(opened.folder, opened.manifest, checksums=not fast)
    if as_json:
        emit_json(
            {
                "bundle": str(bundle),
                "ok": True,
                "checksums": not fast,
                "variants": [v.name for v in opened.manifest.variants],
            }
        )
        return
    render_variants(
        opened.manifest,
        render.console(),
        title=f"{bundle}: OK ({'sizes' if fast else 'sizes and checksums'})",
    )


@main.command("schema")
@click.argument("kind", type=click.Choice(["bundle", "bench"]), default="bundle")
def schema_command(kind: str) -> None:
    """Print the JSON Schema of bundle manifests (docs/bundle.schema.json) or of bench
    results (docs/bench.schema.json)."""
    if kind == "bench":
        from edgekit.bench_results import json_schema as bench_schema

        emit_json(bench_schema())
        return
    from edgekit.manifest import json_schema

    emit_json(json_schema())


def render_variants(manifest: Manifest, console: Console, *, title: str) -> None:
    t = Table(
        "variant",
        "target",
        "quant",
        "size",
        "context",
        "KV cache",
        "memory (predicted)",
    )
    # every string of a manifest is data (a bundle comes from anywhere)
    for v in manifest.variants:
        mem = f"{v.predicted.memory_bytes / 1e9:.2f} GB" if v.predicted.memory_bytes else "-"
        t.add_row(
            render.name(v.name),
            render.name(v.target),
            render.name(v.quant),
            f"{v.size / 1e6:.1f} MB",
            str(v.runtime.context),
            render.name(v.runtime.kv_cache),
            mem,
        )
    # the title holds a path: a line of its own, not wrapped to the table's width
    console.print(render.text(title))
    console.print(t)
