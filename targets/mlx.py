"""Apple's MLX on Apple silicon (prediction only).

edgekit plans for this target (``edgekit plan``, the Mac profiles): it sizes the layouts
``mlx_lm.convert`` writes (group 64, an f16 scale and bias per group) and predicts their
speed from the priors below. Building and running its models is not built yet; ``load``
refuses with ``runtime_note``.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.mlx import FORMAT
from edgekit.targets.contract import Coefficients, KvCacheLayout, Target, UnitSupport

if TYPE_CHECKING:
    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20


class MlxTarget(Target):
    """MLX models on an Apple silicon GPU (Metal)."""

    name: ClassVar[str] = "mlx"
    display_name: ClassVar[str] = "Apple MLX"
    devices: ClassVar[str] = "Apple silicon Macs (Metal); Linux CPU for development"
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[mlx]'"
    sdk_modules: ClassVar[tuple[str, ...]] = ("mlx", "mlx_lm")
    distribution: ClassVar[str] = "mlx"
    runs: ClassVar[bool] = False
    runtime_note: ClassVar[str] = (
        "edgekit plans for this target, but running its models is not built yet "
        "(planned in edgekit issue 16)"
    )
    evaluates: ClassVar[bool] = False
    # No measurement here: ~65% of the unified memory's bandwidth (public mlx-lm
    # token-generation figures); ~200 MB of Metal heaps; the KV cache grows with use.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="gpu",
            formats=("F16", "8bit", "4bit"),
            priors=Coefficients(
                bandwidth_efficiency=0.65,
                token_overhead_s=0.001,
                compute_efficiency=0.4,
                runtime_bytes=200 * MB,
                weight_residency=1.0,
                kv_preallocated=False,
            ),
        ),
    )
    # mlx-lm's gemma3 cache: a rotating buffer of the window on sliding-window layers.
    kv_cache: ClassVar[KvCacheLayout] = KvCacheLayout(windowed_families=frozenset({"gemma3"}))

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's Metal GPU."""
        return [a for a in profile.accelerators if a.runtime_device == "metal"]

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """MLX's default device (on Linux, its CPU backend: real but slow)."""
        import mlx.core as mx

        device = mx.default_device()
        if platform.system() == "Darwin" and platform.machine() == "arm64":
            return True, f"default device: {device}"
        return True, f"default device: {device} (Linux CPU backend: real but slow; for development)"
