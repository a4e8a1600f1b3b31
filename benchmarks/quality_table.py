"""Perplexity and KL divergence of every format of the embedded default model.

Reference: the model's float32 export as an F32 GGUF under llama.cpp with an f32 KV cache
(it matches transformers to ~1e-5 in the parity tests, and is fast). Every format is made
from the same float32 export, evaluated by edgekit's method (docs/accuracy.md) on 8
windows of 512 tokens of the shipped text. Prints one JSON document.

    .venv/bin/python benchmarks/quality_table.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

GGUF = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q4_0", "IQ4_NL", "Q3_K_M", "Q2_K"]
OPENVINO = ["INT8", "INT4", "INT4_SYM"]


def main() -> None:
    from edgekit.converters.convert import convert_model
    from edgekit.targets.llamacpp import LlamaCppTarget
    from edgekit.targets.openvino import OpenVinoTarget

    from edgekit.accuracy import evaluate
    from edgekit.default_model import default_model_path

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        convert_model(default_model_path(), "hf", t / "hf")
        convert_model(t / "hf", "gguf", t / "f32.gguf", quant="F32")
        reference = LlamaCppTarget.load(t / "f32.gguf", logits=True, kv_cache="f32", context=512)
        for target, formats in (("llamacpp", GGUF), ("openvino", OPENVINO)):
            for fmt in formats:
                start = time.perf_counter()
                out = t / f"{target}-{fmt}"
                convert_model(
                    t / "hf",
                    "gguf" if target == "llamacpp" else "openvino",
                    out.with_suffix(".gguf") if target == "llamacpp" else out,
                    quant=fmt,
                )
                path = out.with_suffix(".gguf") if target == "llamacpp" else out
                session = (
                    LlamaCppTarget.load(path, logits=True, context=512)
                    if target == "llamacpp"
                    else OpenVinoTarget.load(path)
                )
                r = evaluate(session, reference, ctx=512, chunks=8)
                session.close()
                size = sum(
                    p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*.bin"))
                )
                rows.append(
                    {
                        "target": target,
                        "format": fmt,
                        "size_mb": round(size / 1e6, 1),
                        "perplexity": round(r.perplexity, 3),
                        "kl_mean": round(r.kl_mean, 5),
                        "kl_p99": round(r.kl_p99, 4),
                        "top1_agreement": round(r.top1_agreement, 4),
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                )
        reference_ppl = round(r.reference_perplexity, 3)
        reference.close()
    print(
        json.dumps(
            {
                "benchmark": "quality_table",
                "model": "SmolLM2-135M-Instruct (float32 export of the Q4_1 GGUF)",
                "reference": "F32 GGUF, llama.cpp, f32 KV cache",
                "reference_perplexity": reference_ppl,
                "windows": "8 x 512 tokens, second halves scored",
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
