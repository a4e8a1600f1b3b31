"""NVIDIA TensorRT Edge-LLM on NVIDIA GPUs and Jetson.

A variant is the portable Edge-LLM export (ONNX, its config and tokenizer files) plus the
engine build settings (``engine.json``), as ``converters/tensorrt`` writes it. The engine
itself is specific to the GPU and the TensorRT release, so ``load`` builds it on the
device at the first load (minutes; progress events through the ``progress`` setting and
the log), caches it keyed by device, TensorRT version, Edge-LLM version, export and
settings, reuses it afterwards and says when and why it rebuilt
(targets/tensorrt_engine.py). A build predicted not to fit the device's memory is refused
before it starts. The session runs Edge-LLM's native runtime
(targets/tensorrt_runtime.py).

The runtime is ``tensorrt_edgellm.runtime.load()``: the wheel's native payload for this
platform (x86_64 Ubuntu with CUDA 13 and TensorRT; on a Jetson, Edge-LLM built from
source against JetPack's TensorRT). Where it cannot load, its own message is the reason
this target is unavailable ("Cannot identify a supported platform from system release
markers." on this project's machines, which have no NVIDIA GPU).

The planner's classmethods delegate to targets/tensorrt_plan.py (the precisions each
chip runs). Importing this module imports neither tensorrt_edgellm nor tokenizers.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.tensorrt import FORMAT
from edgekit.targets import checks, tensorrt_plan
from edgekit.targets.contract import Coefficients, Target, UnitSupport

from edgekit.errors import SettingError, TargetUnavailableError
from edgekit.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    from edgekit.targets.tensorrt_device import Gpu
    from edgekit.targets.tensorrt_runtime import TensorRtSession

    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20
INSTALL_HINT = "pip install 'edgekit[tensorrt]' (x86_64 Linux GPU hosts); Jetson: docs/jetson.md"
# max_batch / max_input / max_output override engine.json's build settings (the engine
# is rebuilt for them); progress: a callable that receives the build's ProgressEvents
SETTINGS = ("max_batch", "max_input", "max_output", "progress")
DEVICES = ("auto", "gpu")


def _formats() -> tuple[str, ...]:
    """Every precision of the format, most bits first (tensorrt_plan narrows them to a
    chip's)."""
    quants = sorted(FORMAT.quants.values(), key=lambda q: -q.bits_per_weight)
    return tuple(q.name for q in quants)


class TensorRtTarget(Target):
    """TensorRT Edge-LLM engines on an NVIDIA GPU or Jetson (CUDA)."""

    name: ClassVar[str] = "tensorrt"
    display_name: ClassVar[str] = "NVIDIA TensorRT Edge-LLM"
    devices: ClassVar[str] = "NVIDIA GPUs and Jetson"
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = INSTALL_HINT
    # tokenizers: the session tokenizes with the export's tokenizer.json (why: the
    # session module's text); onnx: the graph's external-data paths are checked at load
    sdk_modules: ClassVar[tuple[str, ...]] = ("tensorrt_edgellm", "tokenizers", "onnx")
    distribution: ClassVar[str] = "tensorrt-edgellm"
    runs: ClassVar[bool] = True
    evaluates: ClassVar[bool] = False  # the runtime gives no per-position logits
    load_settings: ClassVar[tuple[str, ...]] = SETTINGS
    devices_accepted: ClassVar[tuple[str, ...]] = DEVICES
    # No measurement here: ~70% of the bandwidth (public TensorRT-LLM token-generation
    # figures); ~500 MB of CUDA context and engine buffers; the KV cache is allocated
    # when the engine loads, at its built capacity.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="gpu",
            formats=_formats(),
            priors=Coefficients(
                bandwidth_efficiency=0.7,
                token_overhead_s=0.001,
                compute_efficiency=0.5,
                runtime_bytes=500 * MB,
                weight_residency=1.0,
                kv_preallocated=True,
            ),
        ),
    )

    # --- the planner (no SDK) -------------------------------------------------------------

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's CUDA GPUs (a Jetson's integrated GPU included)."""
        return [a for a in profile.accelerators if (a.runtime_device or "").startswith("cuda")]

    @classmethod
    def unit_formats(cls, profile: DeviceProfile, accelerator: Accelerator) -> tuple[str, ...]:
        return tensorrt_plan.unit_formats(profile, accelerator)

    @classmethod
    def build_recipe(cls, profile: DeviceProfile, accelerator: Accelerator) -> str:
        return tensorrt_plan.build_recipe(profile, accelerator)

    @classmethod
    def build_note(cls, kind: str) -> str:
        return tensorrt_plan.build_note(kind)

    # --- on this host ---------------------------------------------------------------------

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """Edge-LLM's native runtime loads here (its own message when it does not) and
        there is a CUDA GPU: a Jetson module or a GPU NVML lists."""
        from edgekit.targets.tensorrt_device import DeviceUnknown, find_gpu, tensorrt_version

        try:
            load_native()
        except TargetUnavailableError as exc:
            return False, exc.message
        try:
            gpu = find_gpu()
            version = tensorrt_version()
        except DeviceUnknown as exc:
            return False, str(exc)
        return True, f"{gpu.device}, TensorRT {version}"

    @classmethod
    def load_unit(cls, device: str) -> str:
        return "gpu"

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> TensorRtSession:
        """Load a TensorRT Edge-LLM variant folder: the cached engine for this device, or
        one built now from the export (see the module text).

        Settings: ``max_batch``, ``max_input``, ``max_output`` (override engine.json's;
        the engine is built for them), ``progress`` (a callable taking ProgressEvents).

        Raises:
            SettingError: an unknown setting, or one of the wrong type or out of range.
            ModelNotFoundError, ModelFormatError: not an Edge-LLM variant folder.
            TargetUnavailableError: Edge-LLM's runtime cannot load here; no CUDA GPU.
            InsufficientMemoryError: the engine build is predicted not to fit.
            GenerationError: the build or the runtime failed.
        """
        from edgekit.converters.tensorrt.folder import read_export
        from edgekit.targets.tensorrt_device import DeviceUnknown, NativeBuilder, find_gpu
        from edgekit.targets.tensorrt_engine import effective_settings, prepare_engine
        from edgekit.targets.tensorrt_runtime import TensorRtSession

        checks.known_settings(settings, SETTINGS, what="TensorRT Edge-LLM setting")
        given = {k: v for k, v in settings.items() if v is not None}  # None: the default
        progress = _progress(given.pop("progress", no_progress))
        folder = read_export(Path(model))  # every file checked before any is used
        context = int(folder.config["max_position_embeddings"])
        engine_settings = effective_settings(folder.settings, context, **given)
        rt = load_native()
        try:
            gpu = find_gpu()
            _check_precision(engine_settings.precision, gpu)
            engine = prepare_engine(folder, engine_settings, NativeBuilder(rt), progress=progress)
        except DeviceUnknown as exc:
            raise TargetUnavailableError(
                str(exc), hint="TensorRT Edge-LLM needs a CUDA GPU"
            ) from exc
        return TensorRtSession(
            folder, engine, engine_settings, rt=rt, target=cls.name, power_mode=gpu.power_mode
        )


def _check_precision(precision: str, gpu: Gpu) -> None:
    """Refuse, before an engine build starts, a variant whose precision this GPU's SM does
    not run (an FP8 engine.json on an Orin: the build would fail minutes later).

    Raises:
        TargetUnavailableError: the SM is known and lacks the precision.
    """
    from edgekit.converters.tensorrt.socs import precisions_for_sm

    if gpu.sm is None or precision in precisions_for_sm(gpu.sm):
        return
    runs = ", ".join(precisions_for_sm(gpu.sm))
    raise TargetUnavailableError(
        f"{gpu.device} does not run TensorRT Edge-LLM {precision} engines (SM {gpu.sm / 10:.1f} "
        f"runs {runs})",
        hint="pack a variant for this device: edgekit pack MODEL --device PROFILE",
    )


def load_native() -> Any:
    """Edge-LLM's native runtime module (``tensorrt_edgellm.runtime.load()``).

    Raises:
        TargetUnavailableError: the wheel is missing, or its payload cannot load here (the
            message is Edge-LLM's own).
    """
    try:
        from tensorrt_edgellm import runtime
    except ImportError as exc:
        raise TargetUnavailableError(
            "tensorrt-edgellm is not installed", hint=INSTALL_HINT
        ) from exc
    try:
        return runtime.load()
    except Exception as exc:  # noqa: BLE001 - NativeRuntimeError and its kin: the reason
        if type(exc).__name__ == "NativeManifestNotFoundError":
            # a build from source (a Jetson's) has no payload manifest: its extension
            # sits in the package itself, where Edge-LLM's own server looks next
            with contextlib.suppress(ImportError):
                return importlib.import_module("tensorrt_edgellm._edgellm_runtime")
        raise TargetUnavailableError(f"{type(exc).__name__}: {exc}", hint=INSTALL_HINT) from exc


def _progress(value: Any) -> ProgressCallback:
    if not callable(value):
        raise SettingError(
            f"progress must be a callable taking ProgressEvents, not {type(value).__name__}",
            hint="pass a function, or leave progress out",
        )
    return value  # type: ignore[no-any-return]
