"""Gemma 3's sliding-window KV cache: edgekit's prediction against what llama.cpp allocates.

Builds a random Gemma 3 with the attention shape of Gemma 3 270M (18 layers, every sixth
global, 1 KV head of 256, a 512-token window; hidden size and vocabulary small, since they
do not enter the KV cache), converts it to an F16 GGUF with edgekit, and loads it with
llama-cpp-python at several contexts with ``swa_full`` off and on. llama.cpp logs the
size of each KV cache it creates (``llama_kv_cache: size = ... MiB (N cells, L layers``);
the figures are parsed from that log (a child process per load) and set beside
``edgekit.converters.planner.memory.kv_cache_bytes``: with llama.cpp's ``KvCacheLayout``
for the windowed cache, with none (plus llama.cpp's 256-cell padding) for the full one.
The child's peak RSS is reported too. Prints one JSON document.

    .venv/bin/python benchmarks/llamacpp_swa_kv.py [--contexts 512,1000,4096,32768]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SHAPE = {  # Gemma 3 270M's attention; the rest kept small
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
}

LOAD = r"""
import json, resource, sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]),
                      swa_full=sys.argv[3] == "1", n_threads=1, verbose=True)
llm.eval(llm.tokenize(b"It is a truth universally acknowledged"))
print(json.dumps({"peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""
KV_LINE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers")


def build_gguf(work: Path) -> Path:
    import torch
    from edgekit.converters.convert import convert_model
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import build_tokenizer

    tokenizer = build_tokenizer("gemma3", 512)
    config = Gemma3TextConfig(
        vocab_size=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf = work / "gemma3-270m-attention"
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    out = work / "gemma3.gguf"
    convert_model(hf, "gguf", out, quant="F16")
    return out


def measure(gguf: Path, context: int, swa_full: bool) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(gguf), str(context), "1" if swa_full else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    caches = [
        {"mib": float(m.group(1)), "cells": int(m.group(2)), "layers": int(m.group(3))}
        for m in KV_LINE.finditer(done.stderr)
    ]
    rss = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_kb"]
    return {
        "caches": caches,
        "kv_mib": round(sum(c["mib"] for c in caches), 2),
        "peak_rss_mb": round(rss / 1024),
    }


def main() -> None:
    from edgekit.converters.planner.memory import attention_layers, kv_cache_bytes
    from edgekit.targets.registry import get_target

    from edgekit.inspection import inspect_model

    llamacpp = get_target("llamacpp").kv_cache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="512,1000,4096,32768")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekit-swa-") as tmp:
        gguf = build_gguf(Path(tmp))
        spec = inspect_model(gguf)
        for context in (int(c) for c in args.contexts.split(",")):
            padded = -(-context // llamacpp.pad) * llamacpp.pad
            windowed = measure(gguf, context, swa_full=False)
            full = measure(gguf, context, swa_full=True)
            predicted_windowed = kv_cache_bytes(spec, context, layout=llamacpp) / MIB
            predicted_full = kv_cache_bytes(spec, padded) / MIB
            rows.append(
                {
                    "context": context,
                    "swa_full_false": {**windowed, "predicted_mib": round(predicted_windowed, 2)},
                    "swa_full_true": {**full, "predicted_mib": round(predicted_full, 2)},
                }
            )
    print(
        json.dumps(
            {
                "model": "random Gemma 3 with Gemma 3 270M's attention (F16 GGUF)",
                "layers": attention_layers(spec).describe(),
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
