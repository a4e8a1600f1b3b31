"""OpenVINO: export time and peak memory for the embedded default model (INT8 and INT4),
and edgekit's OpenVINO target against openvino-genai's LLMPipeline called directly with
the same settings (same device, precision, prompt, streaming through TextStreamer).

Prefill: a 512-token prompt, one new token. Decode: 128 new tokens (end-of-sequence
ignored), tokens after the first over the time after the first. Median of REPEATS runs
after a warm-up, the two paths alternating. Prints one JSON document.

    .venv/bin/python benchmarks/openvino_overhead.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEATS = 5
PREFILL_TOKENS = 512
DECODE_TOKENS = 128

EXPORT = r"""
import json, resource, sys, time
from edgekit.converters.convert import convert_model
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
convert_model(sys.argv[1], "openvino", sys.argv[2], quant=sys.argv[3])
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": round(seconds, 1), "peak_added_mb": round((peak - baseline) / 1024)}))
"""


def export(src: Path, out: Path, quant: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", EXPORT, str(src), str(out), quant],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    result["size_mb"] = round(sum(p.stat().st_size for p in out.rglob("*.bin")) / 1e6, 1)
    return result


def compare(folder: Path) -> dict[str, dict[str, float]]:
    from importlib import resources

    import numpy as np
    import openvino as ov
    import openvino_genai as genai
    from edgekit.targets.openvino import OpenVinoTarget

    session = OpenVinoTarget.load(folder)
    precision = session.info.settings["inference_precision"]
    direct = genai.LLMPipeline(
        str(folder),
        "CPU",
        INFERENCE_PRECISION_HINT=precision,
        KV_CACHE_PRECISION=session.info.kv_cache,
        INFERENCE_NUM_THREADS=session.info.threads,
    )
    text = resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()
    long_ids = session.tokenize(text)[:PREFILL_TOKENS]
    short_ids = session.tokenize("Once upon a time")

    def direct_run(ids: list[int], new: int) -> list[float]:
        config = direct.get_generation_config()
        config.max_new_tokens, config.do_sample, config.ignore_eos = new, False, True
        arr = np.asarray([ids], dtype=np.int64)
        inputs = genai.TokenizedInputs(ov.Tensor(arr), ov.Tensor(np.ones_like(arr)))
        stamps: list[float] = []

        def on_text(_: str) -> genai.StreamingStatus:
            stamps.append(time.perf_counter())
            return genai.StreamingStatus.RUNNING

        stamps.append(time.perf_counter())
        direct.generate(inputs, config, genai.TextStreamer(direct.get_tokenizer(), on_text))
        stamps.append(time.perf_counter())
        return stamps

    def edgekit_run(ids: list[int], new: int) -> list[float]:
        from edgekit.targets.values import Sampling

        stamps = [time.perf_counter()]
        # ignore_eos is not part of Sampling: a fixed-length run stops at max_tokens or EOS,
        # and runs that ended early are reported by their token counts.
        for chunk in session.stream_tokens(ids, Sampling(max_tokens=new, temperature=0)):
            if chunk.text:
                stamps.append(time.perf_counter())
        stamps.append(time.perf_counter())
        return stamps

    figures: dict[str, list[float]] = {
        k: [] for k in ("e_prefill", "d_prefill", "e_decode", "d_decode")
    }
    for run in range(REPEATS + 1):
        e = edgekit_run(long_ids, 1)
        d = direct_run(long_ids, 1)
        ed = edgekit_run(short_ids, DECODE_TOKENS)
        dd = direct_run(short_ids, DECODE_TOKENS)
        if run == 0:
            continue  # warm-up
        figures["e_prefill"].append(len(long_ids) / (e[-1] - e[0]))
        figures["d_prefill"].append(len(long_ids) / (d[-1] - d[0]))
        figures["e_decode"].append((len(ed) - 3) / (ed[-2] - ed[1]))
        figures["d_decode"].append((len(dd) - 3) / (dd[-2] - dd[1]))
    session.close()
    out = {}
    for kind in ("prefill", "decode"):
        e, d = statistics.median(figures[f"e_{kind}"]), statistics.median(figures[f"d_{kind}"])
        out[f"{kind}_tok_s"] = {
            "edgekit": round(e, 1),
            "direct": round(d, 1),
            "overhead_pct": round(100 * (d - e) / d, 2),
        }
    out["inference_precision"] = precision  # type: ignore[assignment]
    return out


def main() -> None:
    from edgekit.converters.convert import convert_model

    from edgekit.default_model import default_model_path

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        convert_model(default_model_path(), "hf", t / "hf")
        exports = {q: export(t / "hf", t / q, q) for q in ("INT8", "INT4")}
        speed = {q: compare(t / q) for q in ("INT8", "INT4")}
    print(
        json.dumps(
            {
                "benchmark": "openvino",
                "model": "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF)",
                "device": "CPU",
                "export": exports,
                "speed": speed,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
