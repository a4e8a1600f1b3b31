"""OpenVINO F16: edgekit's export against ``optimum-cli export openvino --weight-format
fp16`` on the same Hugging Face folder, side by side.

For each exporter, in fresh child processes, alternating, REPEATS times: the wall time,
the CPU time (user + system), the peak resident memory of the child (``ru_maxrss``) and
the peak of its whole process tree's summed PSS (sampled every 50 ms), the size of
``openvino_model.bin``, and the element types of the IR's constants (bytes per type).
edgekit runs its real code path (``convert_model(..., "openvino", quant="F16")``) and
reports its stages (time and peak RSS) from the progress events: the export itself, the
tokenizer conversion, and the precision check (two CPU compilations and 34 greedy tokens, which
optimum-cli does not do). optimum-cli converts the tokenizer too (its default).

The source is the embedded default model written as a float32 Hugging Face folder by
transformers (what tests/conftest.py's ``smollm2_hf`` fixture builds), unless ``--hf``
names one. Prints one JSON document.

    .venv/bin/python benchmarks/openvino_f16.py [--hf FOLDER] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

EDGEKIT = r"""
import json, sys, threading, time
import psutil
from edgekit.converters.convert import convert_model
me = psutil.Process()
stamps, cpu, peaks, stage = {}, {}, {}, ["export"]
t0 = time.perf_counter()
def sample():
    while True:
        peaks[stage[0]] = max(peaks.get(stage[0], 0), me.memory_info().rss)
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
STAGES = {"tokenizer": "tokenizer", "choosing the precision": "precision_check"}
def progress(event):
    if event.stage == "export":
        stamps.setdefault(event.detail, time.perf_counter() - t0)
        cpu.setdefault(event.detail, time.process_time())
        stage[0] = STAGES.get(event.detail, stage[0])
convert_model(sys.argv[1], "openvino", sys.argv[2], quant="F16", progress=progress)
stamps["done"] = time.perf_counter() - t0
cpu["done"] = time.process_time()
print(json.dumps({"stamps": stamps, "cpu": cpu, "peaks": peaks}))
"""


def build_source(where: Path) -> Path:
    """SmolLM2-135M (the embedded Q4_1 GGUF) as a float32 Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgekit.default_model import default_model_path

    gguf = default_model_path()
    if (where / "config.json").is_file():
        return where
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(where)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(where)
    return where


def run_measured(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``: wall seconds, CPU seconds (user + system, the child and what it
    waited for: steadier than wall time on a shared machine), the peak RSS of the child
    and what it waited for (``ru_maxrss``), the peak of its process tree's summed PSS
    (sampled every 50 ms), and its stdout."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(psutil.Error):
                total = 0
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        # PSS: a child forked from the exporter shares its pages until it
                        # execs, and summed RSS would count them twice
                        total += p.memory_full_info().pss
                peak = max(peak, total)
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.stdout.read() if proc.stdout is not None else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}")
    return {
        "seconds": round(seconds, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "peak_tree_pss_mb": round(peak / 1e6),
        "stdout": out,
    }


def constant_bytes(xml: Path) -> dict[str, int]:
    """Bytes of the IR's constants per element type."""
    sizes: dict[str, int] = {}
    for layer in ET.parse(xml).getroot().iter("layer"):
        data = layer.find("data")
        if layer.get("type") == "Const" and data is not None:
            kind = data.get("element_type", "?")
            sizes[kind] = sizes.get(kind, 0) + int(data.get("size", "0"))
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def one_run(name: str, src: Path, out: Path) -> dict[str, Any]:
    if name == "optimum-cli":
        cli = Path(sys.executable).with_name("optimum-cli")
        cmd = [str(cli), "export", "openvino", "--model", str(src)]
        cmd += ["--task", "text-generation-with-past", "--weight-format", "fp16", str(out)]
    else:
        cmd = [sys.executable, "-c", EDGEKIT, str(src), str(out)]
    result = run_measured(cmd)
    stdout = result.pop("stdout")
    result |= {
        "bin_mb": round((out / "openvino_model.bin").stat().st_size / 1e6, 1),
        "constants_mb": {
            k: round(v / 1e6, 1) for k, v in constant_bytes(out / "openvino_model.xml").items()
        },
    }
    if name == "edgekit":
        report = json.loads(stdout.strip().splitlines()[-1])
        stamps = report["stamps"]
        marks = [stamps.get(k) for k in ("tokenizer", "choosing the precision", "done")]
        if all(m is not None for m in marks):
            export, tokenizer, done = marks
            result["stages_s"] = {
                "export": round(export, 1),
                "tokenizer": round(tokenizer - export, 1),
                "precision_check": round(done - tokenizer, 1),
            }
        result["stage_peak_rss_mb"] = {k: round(v / 1e6) for k, v in report["peaks"].items()}
        cpu = report["cpu"]
        marks = [cpu.get(k) for k in ("tracing the model", "tokenizer", "choosing the precision")]
        if all(m is not None for m in marks):
            start, tokenizer, check = marks
            result["stage_cpu_s"] = {
                "before_export": round(start, 1),  # imports (process CPU time at the start)
                "export": round(tokenizer - start, 1),
                "tokenizer": round(check - tokenizer, 1),
                "precision_check": round(cpu["done"] - check, 1),
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", type=Path, help="a float Hugging Face folder (default: SmolLM2)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgekit-ov-f16-") as tmp:
        work = Path(tmp)
        src = args.hf or build_source(work / "smollm2-hf")
        runs: dict[str, list[dict[str, Any]]] = {"optimum-cli": [], "edgekit": []}
        for i in range(args.repeats):
            order = ["optimum-cli", "edgekit"] if i % 2 == 0 else ["edgekit", "optimum-cli"]
            for name in order:
                out = work / f"{name}-{i}"
                runs[name].append(one_run(name, src, out))
                shutil.rmtree(out)

    def median(name: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[name]))

    keys = ("seconds", "cpu_s", "peak_rss_mb", "peak_tree_pss_mb", "bin_mb")
    summary = {name: {k: median(name, k) for k in keys} for name in runs}
    ratios = {k: round(summary["edgekit"][k] / summary["optimum-cli"][k], 2) for k in keys}
    print(
        json.dumps(
            {
                "source": str(args.hf or "SmolLM2-135M-Instruct (float32 HF folder from the GGUF)"),
                "repeats": args.repeats,
                "median": summary,
                "edgekit_over_optimum_cli": ratios,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
