"""MLX conversion of the embedded default model (SmolLM2-135M-Instruct), two measurements.

Conversion (the default): edgekit's converter (``edgekit convert HF --to mlx --quant Q
--json``) against mlx-lm's own (``python -m mlx_lm convert --hf-path HF --mlx-path OUT
-q --q-bits B --q-group-size 64``: the settings of edgekit's 4BIT / 8BIT; both keep the
source's float type, f32 here) on the same Hugging Face folder (the default model dequantized by
edgekit's GGUF -> HF). Each build is a fresh child process (imports included on both
sides); its wall time and peak resident memory come from ``os.wait4`` (the child's own
rusage). The sides alternate (edgekit first for one quant, second for the next); with
``--rounds N`` each pair is built N times and the medians are reported. Both sides
quantize with mlx's affine kernel at the same bits and group, so the weights must be the
same bytes (``same_weights``: the sha256 of every tensor's data).

Quality (``--kl``): every MLX quant edgekit builds, and 4BIT with AWQ calibrated on the
shipped text after the first 8,000 characters, against the F32 variant: mean next-token
KL over the first 512 tokens of the shipped Austen text, and top-1 agreement, mlx-lm on
this host's mlx (the CPU build on Linux). Prints one JSON document.

    .venv/bin/python benchmarks/mlx_convert.py                 # the default model
    .venv/bin/python benchmarks/mlx_convert.py --hf HF_FOLDER --rounds 3
    .venv/bin/python benchmarks/mlx_convert.py --kl
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
import threading
import time
from pathlib import Path
from typing import Any

BITS = {"4BIT": 4, "8BIT": 8}
# F16 / BF16 are left out: lossless casts, and a 512-token forward pass in f16 takes
# over five minutes on mlx 0.32.4's CPU build (its 16-bit kernels are slow paths)
KL_QUANTS = ("8BIT", "6BIT", "4BIT", "MIXED_4_6", "MIXED_3_6")
KL_TOKENS = 512
CALIBRATION_FROM = 8000  # characters: the calibration text does not overlap the KL tokens


def child(argv: list[str]) -> dict[str, Any]:
    """Run ``argv``; its wall seconds, peak RSS (MB) and stdout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chunks: dict[str, str] = {}

    def read(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    readers = [
        threading.Thread(target=read, args=(n, s))
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for r in readers:
        r.start()
    # communicate() would reap the child and lose its rusage: read the pipes, then wait4
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{chunks.get('err', '')[-3000:]}")
    return {
        "wall_s": round(seconds, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "out": chunks["out"],
    }


def edgekit_build(hf: Path, out: Path, quant: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "edgekit", "convert", str(hf), "--to", "mlx", "--quant", quant,
            "-o", str(out), "--json"]  # fmt: skip
    done = child(argv)
    reported = json.loads(done.pop("out"))
    done["convert_s"] = reported.get("seconds")  # edgekit's own figure, imports excluded
    return done


def mlx_lm_build(hf: Path, out: Path, quant: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(hf),
            "--mlx-path", str(out), "-q", "--q-bits", str(BITS[quant]),
            "--q-group-size", "64"]  # fmt: skip
    done = child(argv)
    done.pop("out")
    return done


def weights_digest(folder: Path) -> str:
    """sha256 over every tensor's name, dtype, shape and data, in name order."""
    import numpy as np
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    tensors: dict[str, Any] = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            tensors.update(load_file(str(file)))
        except (TypeError, ValueError):  # bf16 has no numpy type: read raw through mlx
            import mlx.core as mx

            tensors.update({k: np.array(v.view(mx.uint16)) for k, v in mx.load(str(file)).items()})
    for name in sorted(tensors):
        digest.update(f"{name}{tensors[name].dtype}{tensors[name].shape}".encode())
        digest.update(np.ascontiguousarray(tensors[name]).tobytes())
    return digest.hexdigest()


def conversion(hf: Path, quants: list[str], rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mlx-bench-") as tmp:
        root = Path(tmp)
        for i, quant in enumerate(quants):
            runs: dict[str, list[dict[str, Any]]] = {"edgekit": [], "mlx_lm": []}
            for r in range(rounds):
                e_out, m_out = root / f"edgekit-{quant}-{r}", root / f"mlx_lm-{quant}-{r}"
                sides = [("edgekit", edgekit_build, e_out), ("mlx_lm", mlx_lm_build, m_out)]
                for name, build, out in sides if (i + r) % 2 == 0 else sides[::-1]:
                    runs[name].append(build(hf, out, quant))
            same = weights_digest(root / f"edgekit-{quant}-0") == weights_digest(
                root / f"mlx_lm-{quant}-0"
            )
            results[quant] = _summary(runs, same)
            for r in range(rounds):
                shutil.rmtree(root / f"edgekit-{quant}-{r}")
                shutil.rmtree(root / f"mlx_lm-{quant}-{r}")
    return results


def _summary(runs: dict[str, list[dict[str, Any]]], same: bool) -> dict[str, Any]:
    med = {
        side: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "peak_rss_mb")}
        for side, rs in runs.items()
    }
    med["edgekit"]["convert_s"] = statistics.median(r["convert_s"] for r in runs["edgekit"])
    return {
        **med,
        "wall_ratio": round(med["edgekit"]["wall_s"] / med["mlx_lm"]["wall_s"], 3),
        "peak_rss_ratio": round(med["edgekit"]["peak_rss_mb"] / med["mlx_lm"]["peak_rss_mb"], 3),
        "same_weights": same,
        "rounds": len(runs["edgekit"]),
    }


def _logits(folder: Path, ids: list[int]) -> Any:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    return np.array(model(mx.array([ids]))[0].astype(mx.float32)).astype(np.float64)


def _kl(reference: Any, other: Any) -> dict[str, float]:
    import numpy as np

    def log_softmax(x: Any) -> Any:
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    p, q = log_softmax(reference), log_softmax(other)
    return {
        "mean_kl": round(float((np.exp(p) * (p - q)).sum(-1).mean()), 5),
        "top1_agreement": round(float((reference.argmax(-1) == other.argmax(-1)).mean()), 3),
    }


def quality(hf: Path, only: set[str] | None = None) -> dict[str, Any]:
    """Each quant's KL against the F32 variant (and 4BIT at group 32, with an 8-bit
    embedding, with AWQ), the default model; ``only``: those labels."""
    from edgekit.converters.convert import convert_model
    from tokenizers import Tokenizer

    from edgekit.data import __file__ as data_init

    text = (Path(data_init).parent / "pride-and-prejudice-opening.txt").read_text(encoding="utf-8")
    ids = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(text).ids[:KL_TOKENS]
    results: dict[str, Any] = {"tokens": len(ids), "source": str(hf)}
    with tempfile.TemporaryDirectory(prefix="mlx-kl-") as tmp:
        root = Path(tmp)
        calibration = root / "calibration.txt"
        calibration.write_text(text[CALIBRATION_FROM:], encoding="utf-8")
        convert_model(hf, "mlx", root / "F32", quant="F32")
        reference = _logits(root / "F32", ids)
        builds = [(q, q, None) for q in KL_QUANTS]
        builds.append(("4BIT_G32", "4BIT", "group_size=32"))
        builds.append(("4BIT_E8", "4BIT", "embeddings=8BIT"))
        builds.append(("4BIT_AWQ", "4BIT", f"calibration={calibration}"))
        for label, quant, recipe in builds:
            if only and label not in only:
                continue
            t0 = time.perf_counter()
            convert_model(hf, "mlx", root / label, quant=quant, recipe=recipe)
            seconds = round(time.perf_counter() - t0, 1)
            data = sum(p.stat().st_size for p in (root / label).glob("*.safetensors"))
            results[label] = {
                **_kl(reference, _logits(root / label, ids)),
                "convert_s": seconds,
                "bits_per_weight": round(data * 8 / _parameters(root / "F32"), 3),
            }
            print(json.dumps({label: results[label]}), file=sys.stderr, flush=True)
            shutil.rmtree(root / label)
    return results


def _parameters(f32: Path) -> int:
    return sum(p.stat().st_size for p in f32.glob("*.safetensors")) // 4


def default_hf() -> Path:
    """The default model dequantized to an HF folder by edgekit (cached in a temp dir)."""
    from edgekit.converters.convert import convert_model

    from edgekit.default_model import default_model_path

    out = Path(tempfile.gettempdir()) / "edgekit-mlx-bench-hf"
    if not (out / "config.json").is_file():
        convert_model(default_model_path(), "hf", out, force=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hf", type=Path, help="a Hugging Face folder (default: the default model)"
    )
    parser.add_argument("--quants", default="4BIT,8BIT")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kl", action="store_true", help="measure each quant's KL instead")
    parser.add_argument("--awq", default="", help="AWQ SAMPLESxLENGTH,GRID (default: edgekit's)")
    parser.add_argument("--only", default="", help="with --kl: these labels (4BIT,4BIT_G32,...)")
    args = parser.parse_args()
    if args.awq:  # a smaller calibration, for a slow host (the JSON records it)
        from edgekit.converters.mlx import awq

        shape, _, grid = args.awq.partition(",")
        samples, _, length = shape.partition("x")
        awq.SAMPLES, awq.LENGTH, awq.GRID = int(samples), int(length), int(grid or awq.GRID)
    hf = args.hf or default_hf()
    if args.kl:
        from edgekit.converters.mlx import awq

        measured = quality(hf, {s for s in args.only.split(",") if s} or None)
        measured["awq_calibration"] = {
            "samples": awq.SAMPLES,
            "length": awq.LENGTH,
            "grid": awq.GRID,
        }
        print(json.dumps({"model": "SmolLM2-135M-Instruct", "quality": measured}, indent=2))
        return
    quants = [q.strip().upper() for q in args.quants.split(",") if q.strip()]
    report = {
        "model": "SmolLM2-135M-Instruct",
        "source": str(hf),
        "conversion": conversion(hf, quants, max(1, args.rounds)),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
