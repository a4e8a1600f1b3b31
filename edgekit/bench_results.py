"""Saved bench results (edgekit/bench.py makes them): read strictly, their JSON Schema, the
figures other commands take from them (the manifest's measured figures, the headline
``--compare`` sets side by side), and the calibration sample a result gives the planner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.bench import SCHEMA_VERSION, BenchResult
from edgekit.bundle_open import open_bundle
from edgekit.converters.planner.calibration import record_bench
from edgekit.devices import DeviceProfile
from edgekit.errors import SchemaError
from edgekit.inspection import inspect_model
from edgekit.manifest import Figures
from edgekit.safe_files import read_capped
from edgekit.schema import build, dataclass_json_schema
from edgekit.untrusted import parse_json


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a bench result (docs/bench.schema.json; a test keeps them equal)."""
    return dataclass_json_schema(
        BenchResult,
        title="edgekit bench result",
        schema_id="https://edgekit.dev/schemas/bench-result-1.json",
        consts={"schema_version": SCHEMA_VERSION},
    )


def load_result(path: str | Path) -> BenchResult:
    """A saved result, read strictly.

    Raises:
        SchemaError: not a bench result of a known version.
    """
    p = Path(path)
    # A result holds a few hundred numbers: 16 MiB is far above any real one.
    limit = 16 * 2**20
    try:
        raw = read_capped(p, max_bytes=limit, error=SchemaError)
    except FileNotFoundError as exc:
        raise SchemaError(f"{p}: no such bench result") from exc
    data = parse_json(raw, where=str(p), max_bytes=limit, error=SchemaError)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(f"{p}: not a bench result of schema version {SCHEMA_VERSION}")
    return build(BenchResult, data, str(p), SchemaError)


def measured_figures(result: BenchResult) -> Figures:
    """The result's first run as a manifest ``Figures`` (stored next to the prediction):
    memory is the peak RSS above the pre-load baseline, prefill the longest prompt's."""
    run = result.runs[0]
    longest = max(run.prefill, key=lambda p: p.prompt_tokens, default=None)
    memory = None
    if run.rss_before_load_mb is not None:
        memory = int((run.peak_rss_mb - run.rss_before_load_mb) * 1e6)
    return Figures(
        memory_bytes=memory,
        prefill_tok_s=longest.tok_s.median if longest else None,
        decode_tok_s=run.decode.tok_s.median,
        watts=run.decode.power.avg_w,
        joules_per_token=run.decode.joules_per_token,
        source=f"edgekit bench, {result.created}, power: {result.meter.name}"
        + ("" if result.meter.measured else " (estimated)"),
    )


def headline(result: BenchResult) -> dict[str, float | None]:
    """The figures ``--compare`` sets side by side, from the first run."""
    run = result.runs[0]
    figures: dict[str, float | None] = {
        "load_s": run.load_s,
        "decode_tok_s": run.decode.tok_s.median,
        "decode_w": run.decode.power.avg_w,
        "decode_j_per_token": run.decode.joules_per_token,
        "peak_rss_mb": run.peak_rss_mb,
    }
    for p in run.prefill:
        figures[f"prefill_{p.prompt_tokens}_tok_s"] = p.tok_s.median
        figures[f"ttft_{p.prompt_tokens}_s"] = p.ttft_s.median
    return figures


def record_calibration(result: BenchResult, profile: DeviceProfile) -> Path:
    """Store ``result`` as a calibration sample of ``profile`` (this host) for the planner:
    the benchmarked variant is inspected in its bundle. Returns the calibration file.

    Raises:
        BundleError: the benchmarked bundle cannot be opened any more.
        TargetError: the result's target is not installed.
    """
    opened = open_bundle(result.bundle)
    variant = opened.manifest.variant(result.variant)
    spec = inspect_model(opened.variant_path(variant))
    return record_bench(result, profile, spec=spec, kv_cache=variant.runtime.kv_cache)
