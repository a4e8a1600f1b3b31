"""TensorRT Edge-LLM export of the embedded default model (SmolLM2-135M-Instruct, the
Hugging Face folder edgekit dequantizes from its Q4_1 GGUF, f32): edgekit's conversion
(``edgekit convert HF --to tensorrt --json``) against NVIDIA's exporter run directly
(``<tool env>/bin/tensorrt-edgellm-export HF OUT``), on the same folder.

Each export is a fresh child process; its wall time and peak resident memory come from
``os.wait4``, whose rusage covers the child and the processes it waited for: edgekit's
figure is the larger of edgekit itself and the exporter it drives. edgekit casts an f32
source to f16 before exporting (the engine is F16; the exporter fails on f32 Qwen2), so
its exporter reads f16 where the direct one reads f32 and casts on load. The two graphs
have the same nodes, but the initializers are named and ordered differently (from f32 the
norm weights come out of constant-folded casts), so the data files differ as bytes:
``same_weights`` compares the sorted payloads of every initializer (the ``onnx`` package
of edgekit's environment reads the exports) and the embedding files' bytes. The two sides
alternate order between rounds. Prints one JSON document.

    .venv/bin/python benchmarks/tensorrt_export.py                 # the default model
    .venv/bin/python benchmarks/tensorrt_export.py --hf HF_FOLDER --rounds 3

Needs the export tool environment (``edgekit tools install tensorrt-export``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(argv: list[str]) -> dict[str, Any]:
    """Run ``argv``; its wall seconds, peak RSS (MB) and stdout."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        if code != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{err.read()[-3000:]}")
    return {"wall_s": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "out": out}


def edgekit_export(hf: Path, out: Path) -> dict[str, Any]:
    cli = Path(sys.executable).with_name("edgekit")
    done = child([str(cli), "convert", str(hf), "--to", "tensorrt", "-o", str(out), "--json"])
    done["convert_s"] = json.loads(done.pop("out")).get("seconds")
    return done


def direct_export(hf: Path, out: Path) -> dict[str, Any]:
    from edgekit.converters.tensorrt.tool_env import EXPORT_ENV, EXPORT_SCRIPT

    from edgekit.tool_envs import script

    done = child([str(script(EXPORT_ENV, EXPORT_SCRIPT)), str(hf), str(out)])
    done.pop("out")
    return done


def weights(export: Path) -> tuple[str, str]:
    """sha256 of the export's initializer payloads in sorted order, and of its embedding."""
    import onnx
    from onnx import numpy_helper

    llm = export / "llm"
    model = onnx.load(str(llm / "model.onnx"))  # external data from beside it
    payloads = sorted(numpy_helper.to_array(t).tobytes() for t in model.graph.initializer)
    h = hashlib.sha256()
    for p in payloads:
        h.update(len(p).to_bytes(8, "little") + p)
    return h.hexdigest(), hashlib.sha256((llm / "embedding.safetensors").read_bytes()).hexdigest()


def measure(hf: Path, root: Path, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"edgekit": [], "direct": []}
    same = True
    e_out, d_out = root / "edgekit", root / "direct"
    for turn in range(rounds):
        sides = [
            ("edgekit", lambda: edgekit_export(hf, e_out)),
            ("direct", lambda: direct_export(hf, d_out)),
        ]
        if turn % 2:
            sides.reverse()
        for name, run in sides:
            runs[name].append(run())
        e_data, d_data = e_out / "llm" / "model.onnx.data", d_out / "llm" / "model.onnx.data"
        same = same and weights(e_out) == weights(d_out)
        runs["edgekit"][-1]["export_mb"] = round(e_data.stat().st_size / 1e6, 1)
        runs["direct"][-1]["export_mb"] = round(d_data.stat().st_size / 1e6, 1)
        shutil.rmtree(e_out)
        shutil.rmtree(d_out)
    row: dict[str, Any] = {}
    for name, done in runs.items():
        row[name] = {
            "wall_s": statistics.median(r["wall_s"] for r in done),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in done),
            "onnx_data_mb": done[-1]["export_mb"],
            "wall_s_runs": [r["wall_s"] for r in done],
        }
    row["edgekit"]["convert_s_runs"] = [r["convert_s"] for r in runs["edgekit"]]
    e, d = row["edgekit"], row["direct"]
    row["same_weights"] = same
    row["ratio"] = {
        "wall": round(e["wall_s"] / d["wall_s"], 3),
        "peak_rss": round(e["peak_rss_mb"] / d["peak_rss_mb"], 3),
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", type=Path, help="a Hugging Face folder (default: the GGUF's)")
    parser.add_argument("--rounds", type=int, default=1, help="exports per side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = args.hf
        model = str(hf)
        if hf is None:
            from edgekit.converters.convert import convert_model

            from edgekit.default_model import default_model_path

            hf = root / "hf"
            convert_model(default_model_path(), "hf", hf)
            model = "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF, f32)"
        results = measure(Path(hf), root, args.rounds)
    print(
        json.dumps(
            {
                "benchmark": "tensorrt_export",
                "model": model,
                "measured": "fresh child process per export: wall time and peak RSS "
                "(os.wait4: the child and the processes it waited for), imports included on "
                "both sides; medians over the rounds",
                "rounds": args.rounds,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
