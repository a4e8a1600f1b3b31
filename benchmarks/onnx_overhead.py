"""edgekit's ONNX Runtime target (the qnn target on the CPU execution provider) against
onnxruntime-genai called directly with the same settings: the same variant folder, the
CPU provider (``Config.clear_providers``), ONNX Runtime's default threads (edgekit sets
none unless asked), the same prompt token ids, greedy, the same ``max_length`` (prompt +
the tokens asked for, as the session sizes its generator).

Prefill: a 512-token prompt from the shipped Austen excerpt, one new token; the time from
starting the generation to the first token. Decode: 128 new tokens greedily after a
short prompt, tokens after the first over the time after the first. Both paths stream
token by token and detokenize each token (edgekit through its public
``stream_from_tokens`` handle, Hugging Face ``tokenizers``' DecodeStream; the direct path
with onnxruntime-genai's ``TokenizerStream``), as a streaming app sees them. Each figure
is the median of ROUNDS rounds after one warm-up round; within a round the two paths
run back to back, the first of them alternating round by round (A/B, B/A, ...), so load
drift on a shared machine hits both alike. Greedy text must be equal on both paths
(checked; the script fails otherwise). Prints one JSON document.

    .venv/bin/python benchmarks/onnx_overhead.py                 # converts the default model
    .venv/bin/python benchmarks/onnx_overhead.py --folder ONNX_FOLDER [--folder ...]
    .venv/bin/python benchmarks/onnx_overhead.py --quants INT4,INT8 --rounds 9

The session is the qnn target's own load of the variant folder (``QnnTarget.load``, as
the OpenVINO benchmark loads ``OpenVinoTarget``): ``edgekit.load(bundle)`` returns that
same session object after opening the bundle, so every per-token step measured here is
what it runs.

``caller_cost``: each path's time per token outside the model, with the model replaced by
a generator that replays the same tokens at no cost (edgekit's handle, scheduler,
DecodeStream and stop matching against the direct loop's TokenizerStream), and what edgekit
adds as a share of one measured decode step: on a shared machine a figure steadier than
the difference of two noisy throughputs.

With ``--profile``, one decode of each path runs once more under cProfile: the JSON gets
each path's time outside onnxruntime-genai's model steps per token (the part of a decode
that is the caller's: what edgekit can add) and the functions with the most own time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUNDS = 7
PREFILL_TOKENS = 512
DECODE_TOKENS = 128
DECODE_PROMPT = "Once upon a time"


class Direct:
    """onnxruntime-genai on the variant folder, as a user of its Python API writes it."""

    def __init__(self, folder: Path, threads: int | None) -> None:
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(folder))
        config.clear_providers()  # the CPU provider, as edgekit's session does
        if threads is not None:
            options = {"intra_op_num_threads": threads}
            config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)

    def run(self, ids: list[int], new: int) -> tuple[list[float], list[int]]:
        """Stamps: the start, then one per token; and the tokens."""
        og = self.og
        stamps = [time.perf_counter()]
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + new, do_sample=False)
        generator = og.Generator(self.model, params)
        stream = self.tokenizer.create_stream()
        generator.append_tokens(ids)
        tokens: list[int] = []
        while not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            stream.decode(token)
            stamps.append(time.perf_counter())
            tokens.append(token)
        del generator
        return stamps, tokens


def edgekit_run(session: Any, ids: list[int], new: int) -> tuple[list[float], str]:
    """Stamps: the start, then one per token; and the text."""
    from edgekit.targets.values import Sampling

    stamps = [time.perf_counter()]
    pieces = []
    for chunk in session.stream_from_tokens(ids, Sampling(max_tokens=new, temperature=0)):
        now = time.perf_counter()
        stamps += [now] * chunk.tokens
        pieces.append(chunk.text)
    return stamps, "".join(pieces)


def prefill_rate(stamps: list[float], prompt: int) -> float:
    return prompt / (stamps[1] - stamps[0])


def decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 2) / (stamps[-1] - stamps[1])


def compare(folder: Path, rounds: int, profile: bool) -> dict[str, Any]:
    from importlib import resources

    from edgekit.targets.qnn import QnnTarget

    session = QnnTarget.load(folder, device="cpu")
    direct = Direct(folder, None)  # edgekit sets no threads by default: neither does this
    text = resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()
    long_ids = session.tokenize(text)[:PREFILL_TOKENS]
    short_ids = session.tokenize(DECODE_PROMPT)

    runs: dict[str, Callable[[], tuple[list[float], Any]]] = {
        "e_prefill": lambda: edgekit_run(session, long_ids, 1),
        "d_prefill": lambda: direct.run(long_ids, 1),
        "e_decode": lambda: edgekit_run(session, short_ids, DECODE_TOKENS),
        "d_decode": lambda: direct.run(short_ids, DECODE_TOKENS),
    }
    figures: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, list[int]] = {"e_decode": [], "d_decode": []}
    for r in range(rounds + 1):
        for kind in ("prefill", "decode"):
            order = ("e", "d") if r % 2 == 0 else ("d", "e")
            for who in order:
                key = f"{who}_{kind}"
                stamps, out = runs[key]()
                if kind == "decode":
                    check_same(session, key, out, figures, r)
                if r == 0:
                    continue  # warm-up round
                if kind == "prefill":
                    figures[key].append(prefill_rate(stamps, len(long_ids)))
                else:
                    figures[key].append(decode_rate(stamps))
                    counts[key].append(len(stamps) - 1)
    result: dict[str, Any] = {
        "folder": str(folder),
        "execution_provider": session.info.settings["execution_provider"],
        "threads": session.info.threads,
        "threads_note": "edgekit sets no intra_op_num_threads by default; the direct "
        "path neither: ONNX Runtime's default on both",
        "prompt_tokens": len(long_ids),
        "decode_tokens_per_run": sorted(set(counts["e_decode"] + counts["d_decode"])),
        "rounds": rounds,
    }
    for kind in ("prefill", "decode"):
        e, d = figures[f"e_{kind}"], figures[f"d_{kind}"]
        me, md = statistics.median(e), statistics.median(d)
        # the overhead of each round (its two runs back to back), then their median:
        # less sensitive to a busy spell than the ratio of the two medians
        paired = statistics.median(100 * (b - a) / b for a, b in zip(e, d, strict=True))
        result[f"{kind}_tok_s"] = {
            "edgekit": round(me, 1),
            "direct": round(md, 1),
            "overhead_pct": round(100 * (md - me) / md, 2),
            "paired_overhead_pct": round(paired, 2),
            "edgekit_runs": [round(x, 1) for x in e],
            "direct_runs": [round(x, 1) for x in d],
        }
    _, decode_tokens = direct.run(short_ids, DECODE_TOKENS)
    cost = caller_cost(session, direct, short_ids, decode_tokens)
    cost["added_pct_of_a_token"] = round(
        100 * cost["added_us_per_token"] / (1e6 / result["decode_tok_s"]["direct"]), 2
    )
    result["caller_cost"] = cost
    if profile:
        result["profile"] = {
            "edgekit": profile_decode(runs["e_decode"], DECODE_TOKENS),
            "direct": profile_decode(runs["d_decode"], DECODE_TOKENS),
        }
    session.close()
    return result


_FIRST_TEXT: dict[str, str] = {}


def check_same(session: Any, key: str, out: Any, figures: dict[str, Any], r: int) -> None:
    """Greedy output of both paths must be the same text (the same settings ran)."""
    text = out if isinstance(out, str) else session.detokenize(out)
    first = _FIRST_TEXT.setdefault(str(id(session)), text)
    if text != first:
        raise SystemExit(
            f"round {r}: {key} generated other text than the first decode run:\n"
            f"{text[:200]!r}\nvs\n{first[:200]!r}"
        )


# onnxruntime-genai's own work in a decode: the model steps. Everything else in a run is
# the caller's (Python, tokenizer, stop strings, edgekit's handle).
_RUNTIME_CALLS = ("generate_next_token", "append_tokens")


def profile_decode(run: Callable[[], Any], tokens: int) -> dict[str, Any]:
    """One decode under cProfile: the seconds per token spent outside onnxruntime-genai's
    model steps (cProfile inflates Python calls, so this is an upper bound), and the 12
    functions with the most own time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    run()
    profiler.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(profiler)
    rows, runtime = [], 0.0
    for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(name.endswith(f"{call}>") for call in _RUNTIME_CALLS):
            runtime += own
        rows.append(
            {
                "function": f"{Path(file).name}:{line}:{name}",
                "calls": calls,
                "own_s": round(own, 4),
                "cumulative_s": round(cumulative, 4),
            }
        )
    rows.sort(key=lambda row: -row["own_s"])
    return {
        "wall_s": round(wall, 3),
        "model_steps_s": round(runtime, 3),
        "outside_model_ms_per_token": round(1000 * (wall - runtime) / tokens, 3),
        "outside_model_pct": round(100 * (wall - runtime) / wall, 2),
        "top": rows[:12],
    }


class _ReplayGenerator:
    """Stands in for og.Generator: replays recorded tokens at no model cost, so a run
    through it times only what the caller does per token."""

    def __init__(self, tokens: list[int]) -> None:
        self._tokens, self._i = tokens, -1

    def append_tokens(self, ids: list[int]) -> None:
        pass

    def is_done(self) -> bool:
        return self._i + 1 >= len(self._tokens)

    def generate_next_token(self) -> None:
        self._i += 1

    def get_next_tokens(self) -> list[int]:
        return [self._tokens[self._i]]


def caller_cost(session: Any, direct: Direct, ids: list[int], tokens: list[int]) -> dict[str, Any]:
    """Microseconds per token each path spends outside the model, measured with the
    model replaced by ``_ReplayGenerator`` (the same tokens): edgekit's whole path
    (handle, scheduler, DecodeStream, stop matching) against the direct loop
    (onnxruntime-genai's TokenizerStream). Median of 20 runs."""
    from edgekit.targets.values import Sampling

    class ReplayGenai:  # the parts of the onnxruntime_genai module the session calls
        def __init__(self, og: Any) -> None:
            self.og = og

        def GeneratorParams(self, model: Any) -> Any:  # noqa: N802 - og's name
            return self.og.GeneratorParams(model)

        def Generator(self, model: Any, params: Any) -> _ReplayGenerator:  # noqa: N802
            return _ReplayGenerator(tokens)

    def edgekit_once() -> float:
        t0 = time.perf_counter()
        for _ in session.stream_from_tokens(ids, Sampling(max_tokens=len(tokens), temperature=0)):
            pass
        return time.perf_counter() - t0

    def direct_once() -> float:
        t0 = time.perf_counter()
        generator, stream = _ReplayGenerator(tokens), direct.tokenizer.create_stream()
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
            stream.decode(int(generator.get_next_tokens()[0]))
        return time.perf_counter() - t0

    real, session._og = session._og, ReplayGenai(session._og)  # noqa: SLF001 - measurement only
    try:
        e = statistics.median(edgekit_once() for _ in range(20))
    finally:
        session._og = real  # noqa: SLF001
    d = statistics.median(direct_once() for _ in range(20))
    return {
        "edgekit_us_per_token": round(1e6 * e / len(tokens), 1),
        "direct_us_per_token": round(1e6 * d / len(tokens), 1),
        "added_us_per_token": round(1e6 * (e - d) / len(tokens), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, action="append", help="an ONNX variant folder")
    parser.add_argument("--quants", default="INT4", help="what to convert when no --folder")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = args.folder or convert_default(Path(tmp), args.quants.split(","))
        speed = {f.name: compare(f, args.rounds, args.profile) for f in folders}
    print(
        json.dumps(
            {
                "benchmark": "onnx_overhead",
                "model": "SmolLM2-135M-Instruct (HF export of the Q4_1 GGUF)",
                "execution_provider": "CPUExecutionProvider",
                "settings": {
                    "prefill": f"{PREFILL_TOKENS}-token prompt, 1 new token",
                    "decode": f"{DECODE_PROMPT!r}, {DECODE_TOKENS} new tokens, greedy",
                },
                "speed": speed,
            },
            indent=2,
        )
    )


def convert_default(root: Path, quants: list[str]) -> list[Path]:
    """The default model converted to one ONNX folder per quantization (GGUF -> Hugging
    Face folder once, then the builder)."""
    from edgekit.converters.convert import convert_model
    from edgekit.targets.qnn import QnnTarget

    from edgekit.default_model import default_model_path

    convert_model(default_model_path(), "hf", root / "hf")
    fmt = QnnTarget.format.name
    for q in quants:
        convert_model(root / "hf", fmt, root / q, quant=q)
    return [root / q for q in quants]


if __name__ == "__main__":
    main()
