"""Decode of model sizes the calibration has not seen, measured on this host, as JSON.

    .venv/bin/python benchmarks/planner_held_out.py [--loads N] [--out FILE]

Packs three sizes (a tiny llama, a mid one with 8 layers, the embedded SmolLM2) for every
runnable target that has a CPU unit, benchmarks each variant in LOADS rounds (round-robin,
one thread, 128-token prompt, 256 new tokens, end-of-sequence ignored), reduces every
benchmark to its calibration sample, and then, per (target, unit), fits the calibration on
two sizes and predicts decode of the third (``held_out``). ``--out`` also writes the
document; tests/data/planner_held_out.json is one such run, which
tests/test_planner_accuracy.py replays against the current fitting code.

Why one thread and several loads: on a shared 2-core VM llama.cpp's threads spin-wait for
each other, and one load's decode differs from the next by more than 20%; each variant
keeps its median load (``held_out`` uses it), all loads are in the document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.tiny_models

from edgekit.converters.planner.calibration import device_key, sample_from_bench
from edgekit.converters.planner.fitting import Sample
from edgekit.converters.planner.predict import coefficients, units_for
from edgekit.targets.registry import get_target, runnable_targets

from edgekit.bench import bench
from edgekit.bundle import VariantRequest, pack
from edgekit.bundle_open import open_bundle
from edgekit.default_model import default_model_path
from edgekit.inspection import inspect_model
from edgekit.probe import probe_host

# size name -> tiny-model shape (None: the embedded default model); the planner's held-out
# sizes are the interpolated one (mid) and the extrapolated one (SmolLM2)
SIZES: dict[str, dict[str, int] | None] = {
    "tiny": {"hidden": 64, "vocab_size": 512},
    "mid": {"hidden": 256, "vocab_size": 4096, "layers": 8},
    "smollm2": None,
}
HELD_OUT = ("mid", "smollm2")
# quantization per target: 8-bit for the tiny models, 4-bit for SmolLM2 (what users pick)
QUANTS = {
    "llamacpp": {"tiny": "Q8_0", "mid": "Q8_0", "smollm2": "Q4_K_M"},
    "openvino": {"tiny": "INT8", "mid": "INT8", "smollm2": "INT4"},
}


def _commit() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def held_out(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (target, unit) and held-out size: the decode fitted on the other sizes' median
    samples, against the held-out size's own median sample."""
    from edgekit.converters.planner.calibration import predict_decode
    from edgekit.targets.contract import Coefficients

    rows = []
    for v in variants:
        if v["size"] not in HELD_OUT:
            continue
        others = [
            median_sample(o)
            for o in variants
            if (o["target"], o["unit"]) == (v["target"], v["unit"]) and o["size"] != v["size"]
        ]
        own = median_sample(v)
        prior = Coefficients(**{**v["prior"], "decode_curve": ()})
        predicted = predict_decode(prior, others, own, bandwidth_gbps=v["bandwidth_gbps"])
        measured = 1.0 / own.decode_s_per_token
        rows.append(
            {
                "size": v["size"],
                "target": v["target"],
                "unit": v["unit"],
                "fitted_on": sorted(SIZES.keys() - {v["size"]}),
                "predicted_tok_s": predicted,
                "measured_tok_s": measured,
                "error": None if predicted is None else predicted / measured - 1,
            }
        )
    return rows


def median_sample(variant: dict[str, Any]) -> Sample:
    """The load with the median decode time (the same rule as the test)."""
    loads = sorted(variant["loads"], key=lambda s: s["decode_s_per_token"])
    return Sample(**loads[len(loads) // 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from tests.tiny_models import build_tiny_model

    profile = probe_host(measure=True).profile
    targets = [t for t in runnable_targets() if t.name in QUANTS and units_for(profile, t, None)]
    variants: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgekit-held-out-") as tmp:
        root = Path(tmp)
        for size, shape in SIZES.items():
            source = (
                default_model_path()
                if shape is None
                else build_tiny_model(
                    "llama",
                    root / f"{size}-hf",
                    **shape,  # type: ignore[arg-type]
                )
            )
            requests = [VariantRequest(target=t.name, quant=QUANTS[t.name][size]) for t in targets]
            packed = pack(source, root / size, requests)
            for entry in packed.manifest.variants:
                variants.append({"size": size, "bundle": root / size, "variant": entry.name})
        for _ in range(args.loads):
            for v in variants:
                result = bench(
                    v["bundle"],
                    variant=v["variant"],
                    threads=(1,),
                    prompt_lengths=(128,),
                    gen_tokens=256,
                )
                opened = open_bundle(v["bundle"])
                entry = opened.manifest.variant(v["variant"])
                spec = inspect_model(opened.variant_path(entry))
                target = get_target(result.target)
                layout = target.format.built_layout(spec, result.quant)
                sample = sample_from_bench(
                    result, spec, layout, target, kv_type=entry.runtime.kv_cache
                )
                unit = next(
                    u
                    for u in units_for(profile, target, None)
                    if u.accelerator.kind == result.runs[0].device
                )
                v.update(
                    target=target.name,
                    unit=unit.accelerator.kind,
                    quant=result.quant,
                    bandwidth_gbps=unit.bandwidth_gbps,
                    prior=asdict(coefficients(target, unit, spec)),
                )
                v.setdefault("loads", []).append(
                    {**asdict(sample), "key": f"{v['size']}#{v['variant']}@1"}
                )
    for v in variants:
        v.pop("bundle")
        v["decode_tok_s"] = [round(1.0 / s["decode_s_per_token"], 1) for s in v["loads"]]
    doc = {
        "what": "held-out decode: per (target, unit), fit on two sizes, predict the third",
        "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "host": device_key(profile),
        "loads": args.loads,
        "variants": variants,
        "held_out": held_out(variants),
        "max_abs_error": max(
            (abs(r["error"]) for r in held_out(variants) if r["error"] is not None), default=None
        ),
        "median_abs_error": statistics.median(
            abs(r["error"]) for r in held_out(variants) if r["error"] is not None
        ),
    }
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
