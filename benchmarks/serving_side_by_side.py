"""llama.cpp and OpenVINO served side by side in one run: ``edgekit serve`` with continuous
batching, measured from outside with edgekit's own load test (edgekit/loadtest.py), on the
embedded default model packed as the bundle ships it (llama.cpp Q4_K_M, OpenVINO INT4).

For each target, in every repeat (the targets alternate, so drift of the machine hits both
alike):

- a one-stream server (``--parallel 1``): one client, the single-stream figure;
- a batched server (``--parallel 4``): 1, 2 and 4 clients at once, closed loop.

Every level sends the load test's fixed prompts (PROMPT_TOKENS words, greedy, MAX_TOKENS
at most) and reports, per level, the load test's figures: output tokens a second over the
level (prefill included: what the clients get), and the decode rate, clients / median
time per output token after the first (each client's stream decoding beside the others).
Each figure is the median over the repeats; the ratios are taken within a repeat, then
their median. Issue 18's targets: 4 streams >= 2.5x one stream, one stream on the batched
server >= 0.97x the one-stream server.

Prefix reuse through the server: a ~1,000-token system prompt (its own words each repeat,
so no repeat restores another's), asked one question, then another; the second request's
time to first token against the first's (target <= 20%).

Prints one JSON document; the machine's load average is reported beside the figures.

    .venv/bin/python benchmarks/serving_side_by_side.py [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPEATS = 3
PROMPT_TOKENS = 64
MAX_TOKENS = 128
BATCHED = 4
LEVELS = (1, 2, 4)
SYSTEM_TOKENS = 1000
START_S = 600.0  # a server's load, OpenVINO's pipeline compile included
QUESTIONS = ("Who is the richest man mentioned?", "What does Mrs. Bennet want?")


def pack(folder: Path) -> dict[str, str]:
    """The default model packed with one variant per target: target -> variant name."""
    out = folder / "bundle"
    run = [sys.executable, "-m", "edgekit", "pack", "--quant", "Q4_K_M,openvino:INT4"]
    done = subprocess.run([*run, "-o", str(out), "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pack failed: {done.stderr.strip()}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {v["target"]: v["name"] for v in manifest["variants"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``edgekit serve`` in a child process, ready once /health answers."""

    def __init__(self, bundle: Path, variant: str, parallel: int, threads: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._log = log.open("ab")
        command = [sys.executable, "-m", "edgekit", "serve", str(bundle), "--variant", variant]
        command += ["--parallel", str(parallel), "--threads", str(threads)]
        command += ["--port", str(self.port), "--queue-size", str(max(8, parallel))]
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        import http.client

        end = time.monotonic() + START_S
        while time.monotonic() < end:
            if self._proc.poll() is not None:
                tail = Path(self._log.name).read_text(errors="replace")[-2000:]
                raise SystemExit(f"the server exited ({self._proc.returncode}):\n{tail}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"the server did not answer /health in {START_S:g} s")

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def levels(url: str, clients: tuple[int, ...]) -> dict[int, dict[str, float]]:
    """The load test's figures at each number of ``clients``."""
    from edgekit.loadtest import LoadPlan, run_loadtest

    figures: dict[int, dict[str, float]] = {}
    for c in clients:  # one plan per level: each its own request count
        plan = LoadPlan(
            url=url,
            concurrency=(c,),
            requests=max(8, 8 * c),
            prompt_tokens=PROMPT_TOKENS,
            max_tokens=MAX_TOKENS,
            warmup=1,
        )
        (level,) = run_loadtest(plan).levels
        if level.errors:
            raise SystemExit(f"{level.errors} requests failed at {c} clients: {level.error_kinds}")
        figures[c] = {
            "output_tok_s": level.output_tokens_per_s,
            "decode_tok_s": c / level.tpot_s.p50,
            "ttft_p50_s": level.ttft_s.p50,
            "tpot_p50_s": level.tpot_s.p50,
            "output_tokens_mean": level.output_tokens_mean or 0.0,
        }
    return figures


def prefix_reuse(url: str, repeat: int) -> dict[str, float]:
    """TTFT of a ~1,000-token system prompt's first question, then of a second one."""
    from edgekit.loadtest import first_model
    from edgekit.loadtest_client import Server, stream_one

    text = importlib.resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt")
    words = text.read_text().split()
    # ~0.75 words a token; a different opening word each repeat
    system = f"Repeat {repeat}. " + " ".join(words[: int(SYSTEM_TOKENS * 0.75)])
    server = Server.from_url(url, api_key=None, timeout_s=300)
    model = first_model(server)
    ttft = []
    for n, question in enumerate(QUESTIONS):
        body = {
            "model": model,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
        }
        record = stream_one(server, "chat", body, index=n, t0=time.perf_counter())
        if not record.ok or record.ttft_s is None:
            raise SystemExit(f"the prefix request failed: {record.error}")
        ttft.append(record.ttft_s)
        prompt_tokens = record.prompt_tokens
    return {"first_ttft_s": ttft[0], "second_ttft_s": ttft[1], "prompt_tokens": prompt_tokens or 0}


def one_repeat(bundle: Path, variant: str, threads: int, repeat: int, log: Path) -> dict[str, Any]:
    single = Served(bundle, variant, 1, threads, log)
    try:
        alone = levels(single.url, (1,))[1]
    finally:
        single.close()
    batched = Served(bundle, variant, BATCHED, threads, log)
    try:
        together = levels(batched.url, LEVELS)
        reuse = prefix_reuse(batched.url, repeat)
    finally:
        batched.close()
    return {"single": alone, "batched": together, "prefix": reuse}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float], digits: int = 1) -> float:
        return round(statistics.median(values), digits)

    out: dict[str, Any] = {"single_server": {}, "batched_server": {}, "ratios": {}}
    for key in ("output_tok_s", "decode_tok_s", "ttft_p50_s"):
        digits = 4 if key.endswith("_s") and "tok" not in key else 1
        out["single_server"][key] = med([r["single"][key] for r in runs], digits)
        out["batched_server"][key] = {
            str(c): med([r["batched"][c][key] for r in runs], digits) for c in LEVELS
        }
    for key in ("output_tok_s", "decode_tok_s"):
        out["ratios"][f"4_streams_vs_single_{key}"] = med(
            [r["batched"][BATCHED][key] / r["single"][key] for r in runs], 2
        )
        out["ratios"][f"batched_1_vs_single_{key}"] = med(
            [r["batched"][1][key] / r["single"][key] for r in runs], 3
        )
    out["prefix_reuse"] = {
        "prompt_tokens": runs[-1]["prefix"]["prompt_tokens"],
        "first_ttft_s": med([r["prefix"]["first_ttft_s"] for r in runs], 4),
        "second_ttft_s": med([r["prefix"]["second_ttft_s"] for r in runs], 4),
        "second_vs_first": med(
            [r["prefix"]["second_ttft_s"] / r["prefix"]["first_ttft_s"] for r in runs], 3
        ),
    }
    out["runs"] = runs
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        variants = pack(Path(tmp))
        log = Path(tmp) / "serve.log"
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in variants}
        for repeat in range(args.repeats):
            for target, variant in variants.items():
                runs[target].append(
                    one_repeat(Path(tmp) / "bundle", variant, args.threads, repeat, log)
                )
    result = {
        "benchmark": "serving_side_by_side",
        "model": "SmolLM2-135M-Instruct (embedded Q4_1) packed as llama.cpp Q4_K_M, OpenVINO INT4",
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "repeats": args.repeats,
        "prompt_tokens": PROMPT_TOKENS,
        "max_tokens": MAX_TOKENS,
        "batched_slots": BATCHED,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "targets": {"4_streams_vs_single": 2.5, "batched_1_vs_single": 0.97, "prefix": 0.2},
        "variants": variants,
        **{target: summary(r) for target, r in runs.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
