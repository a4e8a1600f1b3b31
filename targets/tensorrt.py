"""NVIDIA TensorRT on NVIDIA GPUs and Jetson (prediction only).

edgekit plans for this target (``edgekit plan``, the Jetson and GPU profiles): it sizes
the layouts TensorRT-LLM's ModelOpt writes (INT8 weight-only per channel, INT4 AWQ group
128; embeddings and lm_head stay F16) and predicts their speed from the priors below.
Building and running its engines is not built yet; ``load`` refuses with
``runtime_note``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.tensorrt import FORMAT
from edgekit.targets.contract import Coefficients, Target, UnitSupport

from edgekit.host.nvml import NvmlUnavailable, list_nvidia_gpus

if TYPE_CHECKING:
    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20


class TensorRtTarget(Target):
    """TensorRT engines on an NVIDIA GPU (CUDA)."""

    name: ClassVar[str] = "tensorrt"
    display_name: ClassVar[str] = "NVIDIA TensorRT"
    devices: ClassVar[str] = "NVIDIA GPUs and Jetson"
    format: ClassVar[Format] = FORMAT
    # No pip extra: PyPI's tensorrt downloads from NVIDIA at install time; it comes with
    # JetPack on a Jetson and with NVIDIA's own wheels on a desktop GPU.
    install_hint: ClassVar[str] = (
        "install TensorRT from JetPack (Jetson) or NVIDIA's wheels (GPU hosts)"
    )
    sdk_modules: ClassVar[tuple[str, ...]] = ("tensorrt",)
    distribution: ClassVar[str] = "tensorrt"
    runs: ClassVar[bool] = False
    runtime_note: ClassVar[str] = (
        "edgekit plans for this target, but building and running its engines is not built "
        "yet (planned in edgekit issue 17)"
    )
    evaluates: ClassVar[bool] = False
    # No measurement here: ~70% of the bandwidth (public TensorRT-LLM token-generation
    # figures); ~500 MB of CUDA context and engine buffers; the KV cache is allocated
    # when the engine loads.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="gpu",
            formats=("F16", "INT8", "INT4"),
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

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's CUDA GPUs."""
        return [a for a in profile.accelerators if (a.runtime_device or "").startswith("cuda")]

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """The NVIDIA GPUs NVML sees (TensorRT needs one)."""
        try:
            gpus = list_nvidia_gpus()
        except NvmlUnavailable as exc:
            return False, f"tensorrt imports but there is no usable NVIDIA GPU: {exc}"
        return bool(gpus), ", ".join(g.name for g in gpus) or "no NVIDIA GPU"
