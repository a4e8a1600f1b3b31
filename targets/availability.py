"""Is a target usable on this host? Installed SDK, present hardware, and the reason if not."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass

from edgekit.targets.catalog import TARGETS, TargetInfo


@dataclass(frozen=True, kw_only=True)
class TargetStatus:
    name: str
    installed: bool  # the SDK modules import
    usable: bool  # installed, and the hardware it needs is here
    version: str | None
    detail: str  # backends and devices found, or why it cannot run


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _llamacpp() -> tuple[bool, str]:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    # "CPU : SSE3 = 1 | AVX2 = 1 | ..." -> the features switched on in this build
    features = [m.group(1) for m in re.finditer(r"(\w+) = 1", info)]
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    backends = "CPU" + (" + GPU offload" if gpu else "")
    return True, f"backends: {backends}; CPU features: {', '.join(features) or 'none'}"


def _openvino() -> tuple[bool, str]:
    import openvino as ov

    devices = list(ov.Core().available_devices)
    return bool(devices), f"devices: {', '.join(devices)}" if devices else "no OpenVINO device"


def _qnn() -> tuple[bool, str]:
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if "QNNExecutionProvider" in providers:
        return True, "QNNExecutionProvider available"
    return False, (
        "onnxruntime has no QNNExecutionProvider (it ships in onnxruntime-qnn, on Snapdragon "
        f"devices); providers here: {', '.join(providers)}"
    )


def _mlx() -> tuple[bool, str]:
    import mlx.core as mx

    device = mx.default_device()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return True, f"default device: {device}"
    return True, f"default device: {device} (Linux CPU backend: real but slow; for development)"


def _tensorrt() -> tuple[bool, str]:
    from edgekit.host.nvml import NvmlUnavailable, list_nvidia_gpus

    try:
        gpus = list_nvidia_gpus()
    except NvmlUnavailable as exc:
        return False, f"tensorrt imports but there is no usable NVIDIA GPU: {exc}"
    return bool(gpus), ", ".join(g.name for g in gpus) or "no NVIDIA GPU"


_CHECKS: dict[str, Callable[[], tuple[bool, str]]] = {
    "llamacpp": _llamacpp,
    "openvino": _openvino,
    "qnn": _qnn,
    "mlx": _mlx,
    "tensorrt": _tensorrt,
}
_DISTRIBUTIONS = {
    "llamacpp": "llama-cpp-python",
    "openvino": "openvino",
    "qnn": "onnxruntime",
    "mlx": "mlx",
    "tensorrt": "tensorrt",
}


def target_status(info: TargetInfo) -> TargetStatus:
    """Check one target. Imports its SDK (call from the probe, never at import time)."""
    missing = [m for m in info.sdk_modules if importlib.util.find_spec(m) is None]
    version = _version(_DISTRIBUTIONS[info.name])
    if missing:
        return TargetStatus(
            name=info.name,
            installed=False,
            usable=False,
            version=version,
            detail=f"not installed ({', '.join(missing)} missing): {info.install_hint}",
        )
    try:
        usable, detail = _CHECKS[info.name]()
    except Exception as exc:  # an SDK that imports but breaks must not break the probe
        return TargetStatus(
            name=info.name,
            installed=True,
            usable=False,
            version=version,
            detail=f"installed but failed: {type(exc).__name__}: {exc}",
        )
    return TargetStatus(
        name=info.name, installed=True, usable=usable, version=version, detail=detail
    )


def all_target_status() -> tuple[TargetStatus, ...]:
    return tuple(target_status(t) for t in TARGETS)
