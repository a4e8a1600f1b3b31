"""ONNX conversion of the embedded default model (SmolLM2-135M-Instruct): edgekit's
converter (``edgekit convert HF --to onnx --quant Q --json``) against onnxruntime-genai's
model builder called directly (``python -m onnxruntime_genai.models.builder -i HF -o OUT
-p PRECISION -e cpu -c CACHE --extra_options hf_token=false block_size=32``, the switches
edgekit's converter passes), on the same Hugging Face folder, FP32, INT8 and INT4.

Each build is a fresh child process (imports included on both sides); its wall time and
peak resident memory come from ``os.wait4`` (the child's own rusage). The two sides
alternate, edgekit first for one build pair and second for the next, so load drift on
a shared machine hits both alike; with ``--rounds N`` each pair is built N times and the
medians are reported. Both sides run the same builder with the same
options, so their weights must be the same bytes (``same_weights``: the sha256 of
model.onnx.data). Prints one JSON document.

    .venv/bin/python benchmarks/onnx_convert.py                 # the default model
    .venv/bin/python benchmarks/onnx_convert.py --hf HF_FOLDER  # an existing HF export
    .venv/bin/python benchmarks/onnx_convert.py --quants INT4 --rounds 3
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

QUANTS = {"FP32": ("fp32", None), "INT8": ("int8", 32), "INT4": ("int4", 32)}


def child(argv: list[str]) -> dict[str, Any]:
    """Run ``argv``; its wall seconds, peak RSS (MB) and stdout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # communicate() would reap the child and lose its rusage: read the pipes, then wait4
    out, err = _drain(proc)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "out": out}


def _drain(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Read stdout and stderr to their ends (threads, so neither pipe fills) without
    waiting for the process, which wait4 reaps."""
    import threading

    chunks: dict[str, str] = {}

    def read(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    threads = [
        threading.Thread(target=read, args=(n, s))
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return chunks["out"], chunks["err"]


def edgekit_build(hf: Path, out: Path, quant: str) -> dict[str, Any]:
    cli = Path(sys.executable).with_name("edgekit")
    done = child([str(cli), "convert", str(hf), "--to", "onnx", "--quant", quant, "-o", str(out),
                  "--json"])  # fmt: skip
    reported = json.loads(done.pop("out"))
    done["convert_s"] = reported.get("seconds")  # edgekit's own figure, imports excluded
    return done


def direct_build(hf: Path, out: Path, quant: str, cache: Path) -> dict[str, Any]:
    precision, block = QUANTS[quant]
    extra = ["hf_token=false"] + ([f"block_size={block}"] if block else [])
    argv = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
            "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache),
            "--extra_options", *extra]  # fmt: skip
    done = child(argv)
    done.pop("out")
    shutil.rmtree(cache, ignore_errors=True)
    return done


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def onnx_mb(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.glob("model.onnx*")) / 1e6, 1)


def measure(hf: Path, root: Path, quants: list[str], rounds: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        q: {"edgekit": [], "direct": []} for q in quants
    }
    same: dict[str, bool] = {}
    turn = 0
    for _ in range(rounds):
        for quant in quants:
            e_out, d_out = root / f"edgekit-{quant}", root / f"direct-{quant}"
            sides = [
                ("edgekit", lambda q=quant, o=e_out: edgekit_build(hf, o, q)),
                ("direct", lambda q=quant, o=d_out: direct_build(hf, o, q, root / "cache")),
            ]
            if turn % 2:
                sides.reverse()
            turn += 1
            for name, run in sides:
                runs[quant][name].append(run())
            runs[quant]["edgekit"][-1]["onnx_mb"] = onnx_mb(e_out)
            runs[quant]["direct"][-1]["onnx_mb"] = onnx_mb(d_out)
            weights = (digest(e_out / "model.onnx.data"), digest(d_out / "model.onnx.data"))
            same[quant] = same.get(quant, True) and weights[0] == weights[1]
            shutil.rmtree(e_out)
            shutil.rmtree(d_out)
    results: dict[str, Any] = {}
    for quant, sides in runs.items():
        row: dict[str, Any] = {}
        for name, done in sides.items():
            row[name] = {
                "wall_s": statistics.median(r["wall_s"] for r in done),
                "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in done),
                "onnx_mb": done[-1]["onnx_mb"],
                "wall_s_runs": [r["wall_s"] for r in done],
            }
            if name == "edgekit":
                row[name]["convert_s_runs"] = [r["convert_s"] for r in done]
        e, d = row["edgekit"], row["direct"]
        row["same_weights"] = same[quant]
        row["ratio"] = {
            "wall": round(e["wall_s"] / d["wall_s"], 3),
            "peak_rss": round(e["peak_rss_mb"] / d["peak_rss_mb"], 3),
        }
        results[quant] = row
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", type=Path, help="a Hugging Face folder (default: the GGUF's)")
    parser.add_argument("--quants", default="FP32,INT8,INT4")
    parser.add_argument("--rounds", type=int, default=1, help="builds per side and quantization")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = args.hf
        if hf is None:
            from edgekit.converters.convert import convert_model

            from edgekit.default_model import default_model_path

            hf = root / "hf"
            convert_model(default_model_path(), "hf", hf)
        results = measure(Path(hf), root, args.quants.split(","), args.rounds)
    print(
        json.dumps(
            {
                "benchmark": "onnx_convert",
                "model": "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF, f32)",
                "measured": "fresh child process per build: wall time and peak RSS "
                "(os.wait4), imports included on both sides; medians over the rounds",
                "rounds": args.rounds,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
