"""Calibration: ``edgekit bench`` measurements refit the planner's coefficients for this host.

Each benchmark of a bundle variant becomes one sample (``fitting.Sample``), stored per
device and per (target, compute unit) in a small JSON file ($EDGEKIT_CACHE/calibration.json,
else ~/.cache/edgekit/). Re-benchmarking the same variant replaces its sample. At plan
time ``fitting.fit`` turns the samples into coefficients.

The planner does not open bundles: whoever hands a bench result in also hands in the
benchmarked variant's inspected spec and KV-cache type (the bundle side reads them).
"""

from __future__ import annotations

import dataclasses
import json
import platform
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.converters.layouts import WeightLayout
from edgekit.converters.planner.fitting import Sample, fit
from edgekit.converters.planner.memory import resident_bytes
from edgekit.converters.planner.predict import (
    PREFILL_TOKENS,
    coefficients,
    decode_rate,
    kv_bytes,
    prefill_flops_per_token,
    prefill_rate,
    units_for,
)
from edgekit.targets.contract import Coefficients, Target
from edgekit.targets.registry import get_target

from edgekit.atomic import write_atomic
from edgekit.cache import cache_root
from edgekit.devices import GIB, DeviceProfile
from edgekit.errors import SchemaError
from edgekit.host.cpu import read_cpu
from edgekit.host.memory import read_memory
from edgekit.modelspec import ModelSpec
from edgekit.safe_files import read_capped
from edgekit.schema import build
from edgekit.untrusted import parse_json

if TYPE_CHECKING:
    from edgekit.bench import BenchResult

FILE_VERSION = 1
MAX_SAMPLES = 32  # per device and unit; the oldest go first
MAX_FILE_BYTES = 16 << 20  # 32 samples of ~400 bytes per device and unit: far below
_DELETE_IT = "delete it; the next `edgekit bench` writes a new one"


def calibration_file() -> Path:
    return cache_root() / "calibration.json"


def device_key(profile: DeviceProfile) -> str:
    """What identifies a host across runs: CPU, cores, memory, architecture."""
    cpu = profile.cpu
    return _key(cpu.model, cpu.physical_cores, profile.memory.total_gib, profile.arch)


def _key(cpu_model: str, physical_cores: int, total_gib: float, arch: str) -> str:
    return f"{cpu_model} | {physical_cores} cores | {total_gib:.0f} GiB | {arch}"


def this_host_key() -> str | None:
    """``device_key`` of this host's probed profile, read without the probe's slow parts
    (no SDK, no bandwidth measurement): what load calibrates its admission for. None
    when the CPU or memory cannot be read (load then uses the first estimates)."""
    try:
        cpu, memory = read_cpu(), read_memory()
    except (OSError, ValueError):
        return None
    return _key(
        cpu.model, cpu.physical_cores, round(memory.total_bytes / GIB, 3), platform.machine()
    )


def _read() -> dict[str, Any]:
    path = calibration_file()
    try:
        raw = read_capped(path, max_bytes=MAX_FILE_BYTES, error=SchemaError, hint=_DELETE_IT)
    except FileNotFoundError:
        return {"version": FILE_VERSION, "devices": {}}
    data = parse_json(
        raw,
        where=f"{path}: cannot read the calibration file",
        max_bytes=MAX_FILE_BYTES,
        hint=_DELETE_IT,
    )
    if (
        not isinstance(data, dict)
        or data.get("version") != FILE_VERSION
        or not isinstance(data.get("devices"), dict)
        or not all(
            isinstance(units, dict) and all(isinstance(slot, dict) for slot in units.values())
            for units in data["devices"].values()
        )
    ):
        raise SchemaError(
            f"{path}: not a calibration file of version {FILE_VERSION}", hint=_DELETE_IT
        )
    return data


_SAMPLE_KEYS = {f.name for f in dataclasses.fields(Sample)}
_REQUIRED_KEYS = {
    f.name
    for f in dataclasses.fields(Sample)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
}


def samples(device: str, target: str, unit: str) -> list[Sample]:
    """The stored samples of a device and compute unit.

    A sample with other keys (from another edgekit version) is skipped; one with this
    version's keys but a wrong value is an error, not a silent skip.

    Raises:
        SchemaError: the file or a sample is damaged (the hint says to delete it).
    """
    raw = _read()["devices"].get(device, {}).get(f"{target}/{unit}", {})
    out: list[Sample] = []
    for key, value in raw.items():
        if not isinstance(value, dict) or not _REQUIRED_KEYS <= set(value) <= _SAMPLE_KEYS:
            continue  # a sample from another edgekit version: skip, do not fail the plan
        where = f"{calibration_file()}: sample {key!r}"
        try:
            sample = build(Sample, value, where, SchemaError)
        except SchemaError as exc:
            raise SchemaError(exc.message, hint=_DELETE_IT) from exc
        out.append(sample)
    return out


def record(device: str, target: str, unit: str, sample: Sample) -> Path:
    """Store ``sample`` (replacing one with the same key) and return the file's path."""
    data = _read()
    slot = data["devices"].setdefault(device, {}).setdefault(f"{target}/{unit}", {})
    slot.pop(sample.key, None)
    slot[sample.key] = asdict(sample)
    while len(slot) > MAX_SAMPLES:
        slot.pop(next(iter(slot)))
    return write_atomic(calibration_file(), json.dumps(data, indent=1, sort_keys=True))


# --- from a benchmark result -----------------------------------------------------------


def sample_from_bench(
    result: BenchResult,
    spec: ModelSpec,
    layout: WeightLayout,
    target: type[Target],
    *,
    kv_type: str = "f16",
) -> Sample:
    """One Sample from a bench result of the variant ``layout`` describes on ``target``."""
    run = result.runs[0]
    unit = target.unit(run.device)
    # a runtime that allocates the whole context at load holds all of it while measured
    preallocated = target.priors(run.device, spec).kv_preallocated if unit else True
    prompt_max = max((p.prompt_tokens for p in run.prefill), default=0)
    decode_tokens = max(run.decode.tokens, 1)
    used = run.context if preallocated else max(prompt_max + 1, decode_tokens + 8)
    read = layout.bytes_per_token + kv_bytes(
        spec, decode_tokens // 2 + 8, kv_type, target, read=True
    )
    long_prefill = next((p for p in run.prefill if p.prompt_tokens >= PREFILL_TOKENS), None)
    flops = prefill = None
    if long_prefill is not None:
        flops = prefill_flops_per_token(layout, spec, long_prefill.prompt_tokens)
        prefill = 1.0 / long_prefill.tok_s.median
    memory = None
    if run.rss_before_load_mb is not None:
        memory = int((run.peak_rss_mb - run.rss_before_load_mb) * 1e6)
    return Sample(
        key=f"{result.bundle}#{result.variant}@{run.threads}",
        bytes_per_token=float(read),
        decode_s_per_token=1.0 / run.decode.tok_s.median,
        flops_per_token=flops,
        prefill_s_per_token=prefill,
        weights_bytes=layout.total_bytes,
        kv_used_bytes=kv_bytes(spec, used, kv_type, target),
        vocab_term_bytes=target.vocab_runtime_bytes(run.device, spec),
        memory_bytes=memory,
        watts=run.decode.power.avg_w if result.meter.measured else None,
        recorded=datetime.now(UTC).isoformat(timespec="seconds"),
        layers=spec.layers,
    )


def record_bench(
    result: BenchResult, profile: DeviceProfile, *, spec: ModelSpec, kv_cache: str
) -> Path:
    """Store a bench result of a bundle variant as a calibration sample for ``profile``
    (this host). ``spec`` is the benchmarked variant inspected (its file or folder),
    ``kv_cache`` its KV-cache type. Returns the calibration file's path.

    Raises:
        TargetError: the result's target is not installed.
    """
    target = get_target(result.target)
    layout = target.format.built_layout(spec, result.quant)
    sample = sample_from_bench(result, spec, layout, target, kv_type=kv_cache)
    return record(device_key(profile), target.name, result.runs[0].device, sample)


def predict_decode(
    prior: Coefficients, found: list[Sample], own: Sample, *, bandwidth_gbps: float
) -> float | None:
    """Decode tokens/s of the variant ``own`` describes, fitted to ``found`` (which should
    not hold ``own``: that is the held-out prediction the calibration is judged by)."""
    c = fit(
        prior,
        found,
        bandwidth_gbps=bandwidth_gbps,
        peak_tflops=None,
        vocab_term_bytes=own.vocab_term_bytes,
    )
    return decode_rate(c, own.bytes_per_token, bandwidth_gbps, own.layers)


@dataclass(frozen=True, kw_only=True)
class Check:
    """A prediction set beside the benchmark it predicts."""

    bundle: str
    variant: str
    target: str
    unit: str
    samples_used: int
    basis: str
    predicted_memory_bytes: int
    measured_memory_bytes: int | None
    predicted_decode_tok_s: float | None
    measured_decode_tok_s: float
    predicted_prefill_tok_s: float | None
    measured_prefill_tok_s: float | None

    @property
    def memory_error(self) -> float | None:
        if not self.measured_memory_bytes:
            return None
        return self.predicted_memory_bytes / self.measured_memory_bytes - 1

    @property
    def decode_error(self) -> float | None:
        if not self.predicted_decode_tok_s:
            return None
        return self.predicted_decode_tok_s / self.measured_decode_tok_s - 1

    @property
    def prefill_error(self) -> float | None:
        if not self.predicted_prefill_tok_s or not self.measured_prefill_tok_s:
            return None
        return self.predicted_prefill_tok_s / self.measured_prefill_tok_s - 1


def check_against_bench(
    result: BenchResult,
    profile: DeviceProfile,
    *,
    spec: ModelSpec,
    kv_cache: str,
    leave_out: bool = True,
    calibrated: bool = True,
    exclude: frozenset[str] = frozenset(),
) -> Check:
    """Predict a benchmarked variant the way the planner would on ``profile`` (this
    host), at the benchmark's own context and token counts, and set the measurement
    beside it. ``leave_out`` fits without this variant's own sample, so the figure
    shows how the calibration carries to a model it has not seen; ``exclude`` leaves out
    more samples by key (to hold out several sizes at once).

    Raises:
        SchemaError: ``profile`` has no unit of the kind the benchmark ran on.
        TargetError: the result's target is not installed.
    """
    target = get_target(result.target)
    layout = target.format.built_layout(spec, result.quant)
    run = result.runs[0]
    units = [u for u in units_for(profile, target, None) if u.accelerator.kind == run.device]
    if not units:
        raise SchemaError(f"{profile.name} has no {run.device} unit for {target.name}")
    unit = units[0]
    found = samples(device_key(profile), target.name, run.device) if calibrated else []
    own = sample_from_bench(result, spec, layout, target, kv_type=kv_cache)
    if leave_out:
        found = [s for s in found if s.key != own.key]
    found = [s for s in found if s.key not in exclude]
    c = fit(
        coefficients(target, unit, spec),
        found,
        bandwidth_gbps=unit.bandwidth_gbps,
        peak_tflops=unit.peak_tflops,
        vocab_term_bytes=target.vocab_runtime_bytes(run.device, spec),
    )
    decode = prefill = None
    if unit.bandwidth_gbps:
        decode = decode_rate(c, own.bytes_per_token, unit.bandwidth_gbps, spec.layers)
    if unit.peak_tflops and own.flops_per_token:
        prefill = prefill_rate(c, own.flops_per_token, unit.peak_tflops)
    longest = max(run.prefill, key=lambda p: p.prompt_tokens, default=None)
    return Check(
        bundle=str(result.bundle),
        variant=result.variant,
        target=target.name,
        unit=run.device,
        samples_used=len(found),
        basis=c.basis,
        predicted_memory_bytes=resident_bytes(layout.total_bytes, own.kv_used_bytes, c),
        measured_memory_bytes=own.memory_bytes,
        predicted_decode_tok_s=decode,
        measured_decode_tok_s=run.decode.tok_s.median,
        predicted_prefill_tok_s=prefill,
        measured_prefill_tok_s=longest.tok_s.median if longest else None,
    )
