"""edgekit.bench: load time, time to first token, prefill and decode tokens/s, peak memory,
and watts and joules per token, for one bundle variant, with a power meter sampling in
the background. The same text feeds every target, so figures compare across runtimes.

What each figure includes (recorded in every result under ``includes``):

    load_s          opening the bundle, checking sizes, loading the model
    ttft_s          prefill of the prompt plus sampling the first token (tokenization excluded)
    prefill_tok_s   prompt tokens / ttft_s, from an empty cache
    decode_tok_s    tokens after the first / the time after the first: each step's forward
                    pass, greedy sampling and detokenization (as a streaming app sees it)
    watts, joules   the meter's figures over those same windows (``meter`` says which)
"""

from __future__ import annotations

import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psutil

from edgekit import __version__
from edgekit.errors import BenchStoppedError
from edgekit.power.sampler import PowerSampler, PowerWindow
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress

SCHEMA_VERSION = 1
DECODE_PROMPT = "Once upon a time"
INCLUDES = {
    "load_s": "open the bundle, check file sizes, load the model",
    "ttft_s": "prefill of the prompt and sampling of the first token; tokenization excluded",
    "prefill_tok_s": "prompt tokens / ttft_s, from an empty cache",
    "decode_tok_s": "tokens after the first / time after the first: forward pass, greedy sampling, "
    "detokenization per token; end-of-sequence is ignored, so every run generates gen_tokens",
    "power": "the meter's average and peak watts and joules over the same windows",
}


@dataclass(frozen=True, kw_only=True)
class Spread:
    median: float
    min: float
    max: float
    stdev: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(
            median=statistics.median(values),
            min=min(values),
            max=max(values),
            stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
            n=len(values),
        )


@dataclass(frozen=True, kw_only=True)
class Power:
    avg_w: float | None
    peak_w: float | None
    joules: float | None
    complete: bool


@dataclass(frozen=True, kw_only=True)
class PrefillFigures:
    prompt_tokens: int
    ttft_s: Spread
    tok_s: Spread
    power: Power
    joules_per_token: float | None


@dataclass(frozen=True, kw_only=True)
class DecodeFigures:
    tokens: int
    tok_s: Spread
    power: Power
    joules_per_token: float | None


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    threads: int
    context: int
    load_s: float
    prefill: tuple[PrefillFigures, ...]
    decode: DecodeFigures
    peak_rss_mb: float
    # RSS just before the model was loaded: peak - this is what the model cost (older
    # results lack it)
    rss_before_load_mb: float | None = None
    device: str = "cpu"  # the compute unit: cpu, gpu or npu


@dataclass(frozen=True, kw_only=True)
class Thermal:
    cpu_mhz_before: float | None
    cpu_mhz_after: float | None
    temp_c_before: float | None
    temp_c_after: float | None
    power_mode: str | None
    throttled: bool


@dataclass(frozen=True, kw_only=True)
class MeterInfo:
    name: str
    measured: bool
    interval_s: float
    unavailable: dict[str, str] = field(default_factory=dict)
    lost: str | None = None


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    schema_version: int
    created: str
    edgekit_version: str
    host: str
    bundle: str
    variant: str
    target: str
    quant: str
    meter: MeterInfo
    includes: dict[str, str]
    thermal: Thermal
    runs: tuple[BenchRun, ...]

    def to_dict(self) -> dict[str, Any]:
        """As JSON data (tuples become lists)."""
        import json

        data: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return data


@dataclass(frozen=True, kw_only=True)
class LiveSample:
    """What a benchmark shows while it runs (``bench(live=...)``): one point of the live
    charts. ``tok_s`` is the rate over the last ~0.25 s of decoding, or a prompt's
    prefill rate; ``watts`` the meter's latest reading."""

    t: float  # seconds since the benchmark started
    phase: str  # "load", "prefill" or "decode"
    tok_s: float | None
    watts: float | None
    watts_measured: bool
    rss_mb: float
    ttft_s: float | None = None


LiveCallback = Callable[[LiveSample], None]
LIVE_WINDOW_S = 0.25


def bench_text() -> str:
    return resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()


def _thermal() -> tuple[float | None, float | None]:
    try:
        freq = psutil.cpu_freq()
        mhz = float(freq.current) if freq else None
    except (OSError, NotImplementedError, AttributeError):
        mhz = None
    temps: list[float] = []
    try:
        for entries in psutil.sensors_temperatures().values():
            temps.extend(e.current for e in entries if e.current)
    except (AttributeError, OSError):
        pass
    return mhz, (max(temps) if temps else None)


def bench(
    bundle: str | Path,
    *,
    variant: str | None = None,
    threads: tuple[int | None, ...] = (None,),
    context: int | None = None,
    prompt_lengths: tuple[int, ...] = (128, 512),
    gen_tokens: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    meter: str | None = None,
    interval_s: float = 0.1,
    progress: ProgressCallback = no_progress,
    live: LiveCallback | None = None,
    stop: threading.Event | None = None,
) -> BenchResult:
    """Benchmark one variant of ``bundle`` (one run per ``threads`` value).

    ``live`` receives ``LiveSample``s while it runs (for live charts); setting ``stop``
    ends the benchmark at the next token or step.

    Raises:
        BundleError, TargetError: from loading; GenerationError from the runtime.
        BenchStoppedError: ``stop`` was set.
    """
    import edgekit
    from edgekit.host.jetson import read_jetson
    from edgekit.power.select import select_meter
    from edgekit.probe import probe_host
    from edgekit.targets.base import Sampling

    host = probe_host()
    started = time.monotonic()
    process = psutil.Process()

    def emit(phase: str, tok_s: float | None, ttft: float | None = None) -> None:
        if live is None:
            return
        reading = sampler.samples[-1][1] if sampler.samples else None
        live(
            LiveSample(
                t=time.monotonic() - started,
                phase=phase,
                tok_s=tok_s,
                watts=reading,
                watts_measured=power_meter.measured,
                rss_mb=process.memory_info().rss / 1e6,
                ttft_s=ttft,
            )
        )

    def check_stop() -> None:
        if stop is not None and stop.is_set():
            raise BenchStoppedError("the benchmark was stopped before it finished")

    power_meter, skipped = select_meter(
        idle_w=host.profile.power.idle_w, max_w=host.profile.power.max_w, prefer=meter
    )
    jetson = read_jetson()
    mhz_before, temp_before = _thermal()
    text = bench_text()
    runs: list[BenchRun] = []
    steps = len(threads) * (warmup + repeats) * (len(prompt_lengths) + 1)
    done = 0
    chosen_variant = None
    with PowerSampler(power_meter, interval_s) as sampler:
        for n_threads in threads:
            settings: dict[str, Any] = {}
            if n_threads:
                settings["threads"] = n_threads
            if context:
                settings["context"] = context
            with sampler.lock:
                sampler.peak_rss = 0  # per run: peak above this run's own baseline
            rss_before = psutil.Process().memory_info().rss
            t0 = time.perf_counter()
            session = edgekit.load(bundle, variant=variant, **settings)
            load_s = time.perf_counter() - t0
            chosen_variant = session.variant
            emit("load", None)
            try:
                all_ids = session.tokenize(text)
                prefill: list[PrefillFigures] = []
                for length in prompt_lengths:
                    if length >= session.info.context_length:
                        continue
                    ids = all_ids[:length]
                    ttfts: list[float] = []
                    windows: list[PowerWindow] = []
                    for i in range(warmup + repeats):
                        check_stop()
                        session.clear_cache()
                        sampler.sample_now()
                        start_m, start = time.monotonic(), time.perf_counter()
                        for _ in session.stream_tokens(ids, Sampling(max_tokens=1, temperature=0)):
                            pass
                        ttft = time.perf_counter() - start
                        sampler.sample_now()
                        emit("prefill", len(ids) / ttft, ttft)
                        if i >= warmup:
                            ttfts.append(ttft)
                            windows.append(sampler.window(start_m, time.monotonic()))
                        done += 1
                        progress(
                            ProgressEvent(
                                stage="bench", done=done, total=steps, detail=f"prefill {length}"
                            )
                        )
                    joules = [w.joules for w in windows if w.joules is not None]
                    prefill.append(
                        PrefillFigures(
                            prompt_tokens=len(ids),
                            ttft_s=Spread.of(ttfts),
                            tok_s=Spread.of([len(ids) / t for t in ttfts]),
                            power=_merge(windows),
                            joules_per_token=statistics.median(joules) / len(ids)
                            if joules
                            else None,
                        )
                    )
                rates: list[float] = []
                dwindows: list[PowerWindow] = []
                counts: list[int] = []
                prompt_ids = session.tokenize(DECODE_PROMPT)
                for i in range(warmup + repeats):
                    check_stop()
                    session.clear_cache()
                    stamps: list[float] = []
                    tokens = 0
                    last_emit = time.monotonic()
                    for chunk in session.stream_tokens(
                        prompt_ids, Sampling(max_tokens=gen_tokens, temperature=0, ignore_eos=True)
                    ):
                        check_stop()
                        if chunk.tokens:
                            now = time.monotonic()
                            stamps.append(now)
                            tokens += chunk.tokens
                            if live is not None and now - last_emit >= LIVE_WINDOW_S:
                                recent = [s for s in stamps if s >= now - LIVE_WINDOW_S]
                                if len(recent) > 1:
                                    emit("decode", (len(recent) - 1) / (recent[-1] - recent[0]))
                                last_emit = now
                    sampler.sample_now()
                    if len(stamps) > 1:  # the whole run's rate, for live charts of fast models
                        emit("decode", (len(stamps) - 1) / (stamps[-1] - stamps[0]))
                    if i >= warmup and len(stamps) > 1:
                        rates.append((tokens - 1) / (stamps[-1] - stamps[0]))
                        counts.append(tokens - 1)
                        dwindows.append(sampler.window(stamps[0], stamps[-1]))
                    done += 1
                    progress(ProgressEvent(stage="bench", done=done, total=steps, detail="decode"))
                djoules = [
                    w.joules / c
                    for w, c in zip(dwindows, counts, strict=True)
                    if w.joules is not None and c
                ]
                decode = DecodeFigures(
                    tokens=int(statistics.median(counts)) if counts else 0,
                    tok_s=Spread.of(rates) if rates else Spread.of([0.0]),
                    power=_merge(dwindows),
                    joules_per_token=statistics.median(djoules) if djoules else None,
                )
                runs.append(
                    BenchRun(
                        threads=session.info.threads,
                        context=session.info.context_length,
                        load_s=load_s,
                        prefill=tuple(prefill),
                        decode=decode,
                        peak_rss_mb=sampler.peak_rss / 1e6,
                        rss_before_load_mb=rss_before / 1e6,
                        device=str(session.info.settings.get("device", "cpu"))
                        .lower()
                        .split(".")[0],
                    )
                )
            finally:
                session.close()
    mhz_after, temp_after = _thermal()
    throttled = bool(mhz_before and mhz_after and mhz_after < 0.85 * mhz_before) or bool(
        temp_after and temp_after >= 95
    )
    power_meter.close()
    used = chosen_variant
    return BenchResult(
        schema_version=SCHEMA_VERSION,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        edgekit_version=__version__,
        host=f"{host.profile.cpu.model}, {host.profile.cpu.physical_cores} cores, "
        f"{platform.system()}",
        bundle=str(Path(bundle).resolve()),
        variant=used.name if used else "",
        target=used.target if used else "",
        quant=used.quant if used else "",
        meter=MeterInfo(
            name=power_meter.name,
            measured=power_meter.measured,
            interval_s=interval_s,
            unavailable=skipped,
            lost=sampler.lost,
        ),
        includes=INCLUDES,
        thermal=Thermal(
            cpu_mhz_before=mhz_before,
            cpu_mhz_after=mhz_after,
            temp_c_before=temp_before,
            temp_c_after=temp_after,
            power_mode=jetson.power_mode if jetson else None,
            throttled=throttled,
        ),
        runs=tuple(runs),
    )


def _merge(windows: list[PowerWindow]) -> Power:
    """Median average watts, the peak of peaks, median joules, over repeated windows."""
    avgs = [w.avg_w for w in windows if w.avg_w is not None]
    peaks = [w.peak_w for w in windows if w.peak_w is not None]
    joules = [w.joules for w in windows if w.joules is not None]
    return Power(
        avg_w=statistics.median(avgs) if avgs else None,
        peak_w=max(peaks) if peaks else None,
        joules=statistics.median(joules) if joules else None,
        complete=all(w.complete for w in windows) and bool(windows),
    )


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a bench result (docs/bench.schema.json; a test keeps them equal)."""
    from edgekit.schema import dataclass_json_schema

    return dataclass_json_schema(
        BenchResult,
        title="edgekit bench result",
        schema_id="https://edgekit.dev/schemas/bench-result-1.json",
        consts={"schema_version": SCHEMA_VERSION},
    )


def load_result(path: str | Path) -> BenchResult:
    """A saved result, read strictly.

    Raises:
        SchemaError: not a bench result of a known version.
    """
    from edgekit.errors import SchemaError
    from edgekit.safe_files import read_capped
    from edgekit.schema import build
    from edgekit.untrusted import parse_json

    p = Path(path)
    # A result holds a few hundred numbers: 16 MiB is far above any real one.
    limit = 16 * 2**20
    try:
        raw = read_capped(p, max_bytes=limit, error=SchemaError)
    except FileNotFoundError as exc:
        raise SchemaError(f"{p}: no such bench result") from exc
    data = parse_json(raw, where=str(p), max_bytes=limit, error=SchemaError)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(f"{p}: not a bench result of schema version {SCHEMA_VERSION}")
    return build(BenchResult, data, str(p), SchemaError)


def measured_figures(result: BenchResult) -> Any:
    """The result's first run as a manifest ``Figures`` (stored next to the prediction):
    memory is the peak RSS above the pre-load baseline, prefill the longest prompt's."""
    from edgekit.manifest import Figures

    run = result.runs[0]
    longest = max(run.prefill, key=lambda p: p.prompt_tokens, default=None)
    memory = None
    if run.rss_before_load_mb is not None:
        memory = int((run.peak_rss_mb - run.rss_before_load_mb) * 1e6)
    return Figures(
        memory_bytes=memory,
        prefill_tok_s=longest.tok_s.median if longest else None,
        decode_tok_s=run.decode.tok_s.median,
        watts=run.decode.power.avg_w,
        joules_per_token=run.decode.joules_per_token,
        source=f"edgekit bench, {result.created}, power: {result.meter.name}"
        + ("" if result.meter.measured else " (estimated)"),
    )


def headline(result: BenchResult) -> dict[str, float | None]:
    """The figures ``--compare`` sets side by side, from the first run."""
    run = result.runs[0]
    figures: dict[str, float | None] = {
        "load_s": run.load_s,
        "decode_tok_s": run.decode.tok_s.median,
        "decode_w": run.decode.power.avg_w,
        "decode_j_per_token": run.decode.joules_per_token,
        "peak_rss_mb": run.peak_rss_mb,
    }
    for p in run.prefill:
        figures[f"prefill_{p.prompt_tokens}_tok_s"] = p.tok_s.median
        figures[f"ttft_{p.prompt_tokens}_s"] = p.ttft_s.median
    return figures
