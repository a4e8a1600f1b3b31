"""Planner predictions against measurements on this host, as JSON.

    python benchmarks/planner_accuracy.py RESULT.json [RESULT.json ...]

Each RESULT.json is a saved ``edgekit bench ... -o RESULT.json`` of a bundle variant (its
run also fed the calibration file, as ``edgekit bench`` does by default). For every result
three predictions are set beside the measurement: the first estimate (no calibration),
leave-one-out (calibrated on the *other* results only: how the calibration carries to a
model it has not seen) and calibrated (all results). docs/planner.md holds the table.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from edgekit.converters.planner.calibration import check_against_bench

from edgekit.bench_results import load_result
from edgekit.bundle_open import open_bundle
from edgekit.inspection import inspect_model
from edgekit.probe import probe_host


def main(paths: list[str]) -> None:
    profile = probe_host(measure=True).profile
    rows = []
    for path in paths:
        result = load_result(path)
        opened = open_bundle(result.bundle)
        variant = opened.manifest.variant(result.variant)
        spec = inspect_model(opened.variant_path(variant))
        row: dict[str, object] = {"result": path, "variant": result.variant}
        for name, kwargs in (
            ("first_estimate", {"calibrated": False}),
            ("leave_one_out", {"leave_out": True}),
            ("calibrated", {"leave_out": False}),
        ):
            check = check_against_bench(
                result, profile, spec=spec, kv_cache=variant.runtime.kv_cache, **kwargs
            )
            row[name] = {
                **asdict(check),
                "memory_error": check.memory_error,
                "decode_error": check.decode_error,
                "prefill_error": check.prefill_error,
            }
        rows.append(row)
    print(json.dumps({"bandwidth_gbps": profile.memory.bandwidth_gbps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
