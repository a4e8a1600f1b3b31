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

import edgekit
from edgekit import __version__
from edgekit.errors import BenchStoppedError
from edgekit.host.jetson import read_jetson
from edgekit.manifest import Variant
from edgekit.power.base import PowerMeter
from edgekit.power.sampler import PowerSampler, PowerWindow
from edgekit.power.select import use_meter
from edgekit.probe import probe_host
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.targets.session import Session
from edgekit.targets.values import Sampling

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
    detail: str = ""  # what the figure covers (a Jetson's rails: which, and how summed)


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
Clock = Callable[[], float]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one run measures: the bench text cut to each prompt length (prefill, one
    token each, from an empty cache), then ``gen_tokens`` of greedy decoding past
    end-of-sequence; each ``warmup`` times unrecorded, then ``repeats`` times."""

    prompt_lengths: tuple[int, ...] = (128, 512)
    gen_tokens: int = 128
    repeats: int = 3
    warmup: int = 1

    @property
    def steps(self) -> int:
        return (self.warmup + self.repeats) * (len(self.prompt_lengths) + 1)


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
    meter: str | PowerMeter | None = None,
    interval_s: float = 0.1,
    progress: ProgressCallback = no_progress,
    live: LiveCallback | None = None,
    stop: threading.Event | None = None,
    root: Path = Path("/"),
) -> BenchResult:
    """Benchmark one variant of ``bundle`` (one run per ``threads`` value).

    ``meter`` is the power meter: one this host has, by name (``rapl``, ``estimated``,
    ...), or a ``PowerMeter`` to use as it is; None takes the best one readable here.
    ``live`` receives ``LiveSample``s while it runs (for live charts); setting ``stop``
    ends the benchmark at the next token or step. ``root`` is where /sys, /proc and /etc
    are read for the power sensors and a Jetson's nvpmodel mode (a recorded tree in tests).

    Raises:
        BundleError, TargetError: from loading; GenerationError from the runtime.
        BenchStoppedError: ``stop`` was set.
    """
    host = probe_host()
    power_meter, skipped = use_meter(
        meter, idle_w=host.profile.power.idle_w, max_w=host.profile.power.max_w, root=root
    )
    workload = Workload(
        prompt_lengths=prompt_lengths, gen_tokens=gen_tokens, repeats=repeats, warmup=warmup
    )
    jetson = read_jetson(root)
    before = _thermal()
    with PowerSampler(power_meter, interval_s) as sampler:
        measure = Measurement(
            sampler,
            workload,
            progress=progress,
            live=live,
            stop=stop,
            total_steps=len(threads) * workload.steps,
        )
        runs = [
            _load_and_measure(measure, bundle, variant, n_threads, context) for n_threads in threads
        ]
    after = _thermal()
    if power_meter is not meter:  # one it chose itself; a meter given stays the caller's
        power_meter.close()
    chosen = runs[-1][1] if runs else None
    return BenchResult(
        schema_version=SCHEMA_VERSION,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        edgekit_version=__version__,
        host=f"{host.profile.cpu.model}, {host.profile.cpu.physical_cores} cores, "
        f"{platform.system()}",
        bundle=str(Path(bundle).resolve()),
        variant=chosen.name if chosen else "",
        target=chosen.target if chosen else "",
        quant=chosen.quant if chosen else "",
        meter=MeterInfo(
            name=power_meter.name,
            measured=power_meter.measured,
            detail=power_meter.detail,
            interval_s=interval_s,
            unavailable=skipped,
            lost=sampler.lost,
        ),
        includes=INCLUDES,
        thermal=_thermal_facts(before, after, jetson.power_mode if jetson else None),
        runs=tuple(run for run, _ in runs),
    )


def _load_and_measure(
    measure: Measurement,
    bundle: str | Path,
    variant: str | None,
    threads: int | None,
    context: int | None,
) -> tuple[BenchRun, Variant | None]:
    """One run: load the variant with ``threads``, measure it, close it; the run and the
    manifest variant it measured."""
    settings: dict[str, Any] = {}
    if threads:
        settings["threads"] = threads
    if context:
        settings["context"] = context
    with measure.sampler.lock:
        measure.sampler.peak_rss = 0  # per run: peak above this run's own baseline
    rss_before = psutil.Process().memory_info().rss
    t0 = measure.clock()
    # the load's own events (a TensorRT engine built on the first load) reach the caller
    session = edgekit.load(bundle, variant=variant, progress=measure.progress, **settings)
    try:
        load_s = measure.clock() - t0
        measure.emit("load", None)
        return measure.run(session, load_s=load_s, rss_before=rss_before), session.variant
    finally:
        session.close()


def _thermal_facts(
    before: tuple[float | None, float | None],
    after: tuple[float | None, float | None],
    power_mode: str | None,
) -> Thermal:
    (mhz_before, temp_before), (mhz_after, temp_after) = before, after
    throttled = bool(mhz_before and mhz_after and mhz_after < 0.85 * mhz_before) or bool(
        temp_after and temp_after >= 95
    )
    return Thermal(
        cpu_mhz_before=mhz_before,
        cpu_mhz_after=mhz_after,
        temp_c_before=temp_before,
        temp_c_after=temp_after,
        power_mode=power_mode,
        throttled=throttled,
    )


class Measurement:
    """Measures loaded sessions against one power sampler: every figure of a BenchRun.

    Every generation goes through the session's scheduler (a handle from token ids), so
    a benchmark waits its turn like any other caller. ``clock`` times every figure; it
    must be the power meter's own (``time.monotonic`` for edgekit's meters), since
    windows of the sampler are cut by it."""

    def __init__(
        self,
        sampler: PowerSampler,
        workload: Workload,
        *,
        clock: Clock = time.monotonic,
        progress: ProgressCallback = no_progress,
        live: LiveCallback | None = None,
        stop: threading.Event | None = None,
        total_steps: int | None = None,
    ) -> None:
        self.sampler = sampler
        self.workload = workload
        self.clock = clock
        self.progress = progress
        self.live = live
        self.stop = stop
        self.total = workload.steps if total_steps is None else total_steps
        self.done = 0
        self.started = clock()
        self._process = psutil.Process()

    def run(self, session: Session, *, load_s: float, rss_before: int | None) -> BenchRun:
        """Prefill for each prompt length that fits the context, then decode."""
        all_ids = session.tokenize(bench_text())
        prefill = tuple(
            self.prefill(session, all_ids[:length])
            for length in self.workload.prompt_lengths
            if length < session.info.context_length
        )
        decode = self.decode(session, session.tokenize(DECODE_PROMPT))
        return BenchRun(
            threads=session.info.threads,
            context=session.info.context_length,
            load_s=load_s,
            prefill=prefill,
            decode=decode,
            peak_rss_mb=self.sampler.peak_rss / 1e6,
            rss_before_load_mb=rss_before / 1e6 if rss_before is not None else None,
            device=session.info.unit,
        )

    def prefill(self, session: Session, ids: list[int]) -> PrefillFigures:
        """Time to the first token of ``ids`` from an empty cache, with its power."""
        ttfts: list[float] = []
        windows: list[PowerWindow] = []
        w = self.workload
        for i in range(w.warmup + w.repeats):
            self.check_stop()
            session.clear_cache()
            self.sampler.sample_now()
            start = self.clock()
            with session.start(ids, Sampling(max_tokens=1, temperature=0)) as generation:
                for _ in generation:
                    pass
            end = self.clock()
            self.sampler.sample_now()
            ttft = end - start
            self.emit("prefill", len(ids) / ttft, ttft)
            if i >= w.warmup:
                ttfts.append(ttft)
                windows.append(self.sampler.window(start, end))
            self.step(f"prefill {len(ids)}")
        joules = [x.joules for x in windows if x.joules is not None]
        return PrefillFigures(
            prompt_tokens=len(ids),
            ttft_s=Spread.of(ttfts),
            tok_s=Spread.of([len(ids) / t for t in ttfts]),
            power=_merge(windows),
            joules_per_token=statistics.median(joules) / len(ids) if joules else None,
        )

    def decode(self, session: Session, prompt_ids: list[int]) -> DecodeFigures:
        """Tokens after the first per second, and joules per token, over the time after
        the first token (EOS ignored: every repeat generates ``gen_tokens``)."""
        rates: list[float] = []
        windows: list[PowerWindow] = []
        counts: list[int] = []
        w = self.workload
        for i in range(w.warmup + w.repeats):
            self.check_stop()
            session.clear_cache()
            stamps = self._decode_once(session, prompt_ids)
            self.sampler.sample_now()
            if len(stamps) > 1:  # the whole run's rate, for live charts of fast models
                self.emit("decode", (len(stamps) - 1) / (stamps[-1] - stamps[0]))
            if i >= w.warmup and len(stamps) > 1:
                rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
                counts.append(len(stamps) - 1)
                windows.append(self.sampler.window(stamps[0], stamps[-1]))
            self.step("decode")
        per_token = [
            x.joules / c for x, c in zip(windows, counts, strict=True) if x.joules is not None and c
        ]
        return DecodeFigures(
            tokens=int(statistics.median(counts)) if counts else 0,
            tok_s=Spread.of(rates) if rates else Spread.of([0.0]),
            power=_merge(windows),
            joules_per_token=statistics.median(per_token) if per_token else None,
        )

    def _decode_once(self, session: Session, prompt_ids: list[int]) -> list[float]:
        """One decode: the time of each token (a chunk of n tokens counts n times)."""
        sampling = Sampling(max_tokens=self.workload.gen_tokens, temperature=0, ignore_eos=True)
        stamps: list[float] = []
        last_emit = self.clock()
        with session.start(prompt_ids, sampling) as generation:
            for chunk in generation:
                self.check_stop()
                if not chunk.tokens:
                    continue
                now = self.clock()
                stamps += [now] * chunk.tokens
                if self.live is not None and now - last_emit >= LIVE_WINDOW_S:
                    recent = [s for s in stamps if s >= now - LIVE_WINDOW_S]
                    if len(recent) > 1:
                        self.emit("decode", (len(recent) - 1) / (recent[-1] - recent[0]))
                    last_emit = now
        return stamps

    def emit(self, phase: str, tok_s: float | None, ttft: float | None = None) -> None:
        if self.live is None:
            return
        samples = self.sampler.samples
        self.live(
            LiveSample(
                t=self.clock() - self.started,
                phase=phase,
                tok_s=tok_s,
                watts=samples[-1][1] if samples else None,
                watts_measured=self.sampler.meter.measured,
                rss_mb=self._process.memory_info().rss / 1e6,
                ttft_s=ttft,
            )
        )

    def check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise BenchStoppedError("the benchmark was stopped before it finished")

    def step(self, detail: str) -> None:
        self.done += 1
        self.progress(ProgressEvent(stage="bench", done=self.done, total=self.total, detail=detail))


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
