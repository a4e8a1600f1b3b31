"""Apple's MLX through mlx-lm: the Metal GPU on Apple silicon, MLX's CPU backend on Linux
(``mlx[cpu]``: real but slow, what CI and development here run).

Which device runs a model: MLX's default device (mlx-lm's generate_step runs on a stream
of the default device, made when mlx_lm.generate is imported). ``device="gpu"`` needs
Metal; ``device="cpu"`` needs a default device that is the CPU (Linux): on a Mac,
generate_step would run on the GPU whatever edgekit asked, so it is refused, not ignored.

Memory: Metal lets a process wire at most its recommended working set, and mlx-lm warns
past 0.9 of it (and swaps or fails beyond). The planner holds GPU candidates to 0.9 of a
profile's GPU memory (``memory_cap``); ``load`` refuses, before mlx reads a tensor, a
variant whose weights plus the KV cache at the context exceed 0.9 of this Mac's
``max_recommended_working_set_size`` (``host_memory_cap``), saying how to raise it.

Every folder is checked before mlx opens a file (targets/mlx_folder.py); the session is
targets/mlx_runtime.py.
"""

from __future__ import annotations

import math
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.mlx import FORMAT
from edgekit.targets import checks
from edgekit.targets.contract import (
    Coefficients,
    HostDevice,
    KvCacheLayout,
    MemoryCap,
    Target,
    UnitSupport,
)

from edgekit.errors import InsufficientMemoryError, TargetUnavailableError

if TYPE_CHECKING:
    from edgekit.targets.mlx_folder import MlxFolder
    from edgekit.targets.mlx_runtime import MlxSession

    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20
SETTINGS = ("device", "context", "kv_cache", "logits", "parallel")
DEVICES = ("auto", "cpu", "gpu")
WORKING_SET_SHARE = 0.9  # mlx-lm warns past 0.9 of Metal's recommended working set
CAP_WHY = "mlx-lm's 0.9 of the GPU working set"
CAP_HINT = (
    "raise macOS's cap with `sudo sysctl iogpu.wired_limit_mb=N` (macOS 15+), or use a "
    "smaller variant or context"
)
KV_GROUP = 64  # mlx-lm's QuantizedKVCache group: one f16 scale and bias per 64 values


def _apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


class MlxTarget(Target):
    """MLX models: Metal on Apple silicon, the CPU backend on Linux."""

    name: ClassVar[str] = "mlx"
    display_name: ClassVar[str] = "Apple MLX"
    devices: ClassVar[str] = "Apple silicon Macs (Metal); Linux CPU for development"
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[mlx]'"
    # tokenizers: the session tokenizes with Hugging Face's (mlx_runtime.py says why)
    sdk_modules: ClassVar[tuple[str, ...]] = ("mlx", "mlx_lm", "tokenizers")
    distribution: ClassVar[str] = "mlx"
    runs: ClassVar[bool] = True
    evaluates: ClassVar[bool] = True
    load_settings: ClassVar[tuple[str, ...]] = SETTINGS
    devices_accepted: ClassVar[tuple[str, ...]] = DEVICES
    priority: ClassVar[int] = 30
    # First estimates; reasoning, in order of the fields:
    #  GPU: no measurement here (no Mac): ~65% of the unified memory's bandwidth (public
    #    mlx-lm token-generation figures); ~200 MB of Metal heaps; the KV cache grows with
    #    use (mlx-lm's KVCache grows in steps of 256 positions).
    #  CPU (mlx[cpu] on Linux), measured here (benchmarks/mlx_overhead.py and a load/RSS
    #    check; 2-core VM shared with other work: lower bounds): SmolLM2-135M 4BIT
    #    (edgekit's conversion, f32 scales, 84.2 MB of weights) decodes 5.0 tok/s, 0.42 GB/s
    #    of the host's 23 GB/s: 1.8%. MLX's CPU quantized matmul is compute-bound here,
    #    so this is a fit to that figure more than a bandwidth share (bf16 scales run
    #    ~30x slower still: converters/mlx keeps an f32 source's f32). Prefill 7.9 tok/s
    #    at 287.7 MFLOP per token: 1.4% of the 0.16 TFLOPS fp32 peak. The tiny model (0.5
    #    MB, 2 layers) decodes at 3.4-3.7 ms per token: the fixed cost. RSS after load:
    #    SmolLM2 108.9 MiB over the imported process, 80.3 MiB of it the weights (read
    #    once, ~29 MiB of buffers); the KV cache grows with use.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="gpu",
            # most precise first (KL measured on SmolLM2: converters/mlx/format.py)
            formats=("F16", "8BIT", "6BIT", "MIXED_4_6", "4BIT", "MIXED_3_6"),
            priors=Coefficients(
                bandwidth_efficiency=0.65,
                token_overhead_s=0.001,
                compute_efficiency=0.4,
                runtime_bytes=200 * MB,
                weight_residency=1.0,
                kv_preallocated=False,
            ),
        ),
        UnitSupport(
            kind="cpu",
            formats=("8BIT", "4BIT"),
            priors=Coefficients(
                bandwidth_efficiency=0.018,
                token_overhead_s=0.003,
                compute_efficiency=0.014,
                runtime_bytes=30 * MB,
                weight_residency=1.0,
                kv_preallocated=False,
            ),
        ),
    )
    # mlx-lm's gemma3 cache: a rotating buffer of the window on sliding-window layers.
    kv_cache: ClassVar[KvCacheLayout] = KvCacheLayout(windowed_families=frozenset({"gemma3"}))

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's Metal GPU; on this Linux host (profile ``host``) also its CPU,
        which MLX's CPU backend runs on here."""
        found = [a for a in profile.accelerators if a.runtime_device == "metal"]
        if profile.name == "host" and platform.system() == "Linux":
            found += [a for a in profile.accelerators if a.kind == "cpu"]
        return found

    @classmethod
    def memory_cap(cls, profile: DeviceProfile, kind: str, unit_bytes: int) -> MemoryCap | None:
        """On a Mac's GPU, mlx-lm's 0.9 of the working set (the profile's GPU memory).
        Not on iOS: there the limit is the app's (the profile's figure already), and an
        app runs mlx-swift, not mlx-lm."""
        if kind != "gpu" or profile.os != "macos":
            return None
        return MemoryCap(bytes=int(WORKING_SET_SHARE * unit_bytes), why=CAP_WHY, hint=CAP_HINT)

    @classmethod
    def host_memory_cap(cls, kind: str) -> MemoryCap | None:
        """On a Mac's GPU, 0.9 of Metal's recommended working set as MLX reports it."""
        if kind != "gpu" or not _apple_silicon():
            return None
        import mlx.core as mx

        size = mx.device_info(mx.gpu).get("max_recommended_working_set_size")
        if not isinstance(size, int) or size <= 0:
            return None
        return MemoryCap(
            bytes=int(WORKING_SET_SHARE * size),
            why=f"{CAP_WHY} ({size / 2**30:.1f} GiB recommended by Metal)",
            hint=CAP_HINT,
        )

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """MLX's default device (on Linux, its CPU backend: real but slow)."""
        import mlx.core as mx

        device = mx.default_device()
        if _apple_silicon():
            return True, f"default device: {device}"
        return True, f"default device: {device} (Linux CPU backend: real but slow; for development)"

    @classmethod
    def host_devices(cls) -> tuple[HostDevice, ...] | None:
        """The Metal GPU on a Mac (its name as MLX reports it); elsewhere MLX lists none."""
        if not _apple_silicon():
            return None
        import mlx.core as mx

        if not mx.metal.is_available():
            return ()
        name = str(mx.device_info(mx.gpu).get("device_name", "Apple GPU"))
        return (HostDevice(kind="gpu", device="metal", name=name),)

    @classmethod
    def load_unit(cls, device: str) -> str:
        """``auto`` runs on MLX's default device: the GPU where Metal is, else the CPU."""
        if device in ("cpu", "gpu"):
            return device
        try:
            import mlx.core as mx
        except ImportError:  # pack sizes variants on hosts without the SDK
            return "gpu" if _apple_silicon() else "cpu"
        return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"

    @classmethod
    def device_settings(cls, device: str) -> dict[str, Any]:
        super().device_settings(device)  # refuses a device this target does not know
        return {"device": device}

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> MlxSession:
        """Load an MLX variant folder (config.json, model*.safetensors, tokenizer.json).

        Settings: ``device`` (auto, cpu, gpu), ``context`` (tokens, up to the model's
        max_position_embeddings), ``kv_cache`` (f16: not quantized, as are bf16 and f32;
        q8_0 and q4_0: mlx-lm's 8- and 4-bit KV cache), ``logits``, ``parallel`` (N > 1:
        N generations decoded together by mlx-lm's BatchGenerator, each with ``context``
        tokens of KV cache, prefix reuse on; the cache is not quantized then:
        targets/mlx_batch.py).

        Raises:
            SettingError: an unknown setting, or one of the wrong type or out of range.
            TargetUnavailableError: mlx / mlx-lm missing; a device MLX cannot run here.
            InsufficientMemoryError: the weights and the KV cache exceed this Mac's cap.
            ModelNotFoundError, ModelFormatError: not an MLX variant folder.
            GenerationError: mlx-lm refused the model.
        """
        from edgekit.targets.mlx_folder import read_folder
        from edgekit.targets.mlx_runtime import DEFAULT_CONTEXT, MlxSession, kv_bits

        checks.known_settings(settings, SETTINGS, what="MLX setting")
        given = {k: v for k, v in settings.items() if v is not None}  # None: the default
        device = checks.choice("device", given.pop("device", "auto"), DEVICES)
        unit = _unit_here(device)
        folder = read_folder(Path(model))
        context = given.get("context")
        # the session checks both again (and says the range); here only to size the KV
        tokens = context if isinstance(context, int) else DEFAULT_CONTEXT
        kv = given.get("kv_cache", folder.kv_cache)
        bits = kv_bits(kv) if isinstance(kv, str) and kv in ("q8_0", "q4_0") else None
        streams = given.get("parallel")
        streams = streams if isinstance(streams, int) and streams > 1 else 1
        context_here = min(tokens, folder.context_length)
        check_memory(folder, context_here, bits, cls.host_memory_cap(unit), streams=streams)
        return MlxSession(folder, target=cls.name, unit=unit, **given)


def _unit_here(device: str) -> str:
    """The unit ``device`` runs on here (see the module text).

    Raises:
        TargetUnavailableError: mlx missing; the GPU without Metal; the CPU where MLX's
            default device is the GPU.
    """
    try:
        import mlx.core as mx
    except ImportError as exc:
        raise TargetUnavailableError("mlx is not installed", hint=MlxTarget.install_hint) from exc
    default = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
    if device == "gpu" and default != "gpu":
        raise TargetUnavailableError(
            f"MLX has no Metal GPU here (its default device is {mx.default_device()})",
            hint="load with device='cpu' or 'auto' here; the GPU is an Apple silicon Mac's",
        )
    if device == "cpu" and default != "cpu":
        raise TargetUnavailableError(
            "mlx-lm generates on MLX's default device, the GPU here: device='cpu' would "
            "not be honoured",
            hint="load with device='gpu' or 'auto'",
        )
    return default


def kv_cache_bytes(folder: MlxFolder, context: int, bits: int | None) -> int:
    """The KV cache of ``context`` positions: keys and values of every layer, in the
    model's float dtype, or ``bits`` per value plus a float scale and bias per group."""
    values = 2 * folder.layers * folder.kv_heads * folder.head_dim * context
    if bits is None:
        return values * folder.activation_bytes
    return values * bits // 8 + (values // KV_GROUP) * 2 * folder.activation_bytes


def check_memory(
    folder: MlxFolder, context: int, bits: int | None, cap: MemoryCap | None, *, streams: int = 1
) -> None:
    """Refuse ``folder`` when its weights and the KV caches of ``streams`` sequences
    exceed ``cap`` (None: no cap).

    Raises:
        InsufficientMemoryError: with the figures and how to raise the cap.
    """
    if cap is None:
        return
    kv = streams * kv_cache_bytes(folder, context, bits)
    need = folder.weight_bytes + kv
    if need <= cap.bytes:
        return
    gib = 1 << 30
    caches = f"{streams} streams x {context:,} tokens" if streams > 1 else f"{context:,} tokens"
    raise InsufficientMemoryError(
        f"{folder.path}: {folder.weight_bytes / gib:.2f} GiB of weights + "
        f"{kv / gib:.2f} GiB of KV cache at {caches} = {need / gib:.2f} GiB, "
        f"over {cap.why}: {cap.bytes / gib:.2f} GiB",
        hint=f"{cap.hint}; this one needs a working set of "
        f"{math.ceil(need / WORKING_SET_SHARE / MB):,} MB or more",
    )
