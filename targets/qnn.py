"""Qualcomm's Hexagon NPU through ONNX Runtime's QNN execution provider (prediction only).

edgekit plans for this target (``edgekit plan``, device profiles with a Hexagon NPU):
it sizes the usual AI Hub / Genie layouts (W8A16 / W4A16, per-channel symmetric) and
predicts their speed from the priors below. Building and running its models is not
built yet; ``load`` refuses with ``runtime_note``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.onnx import FORMAT
from edgekit.targets.contract import Coefficients, Target, UnitSupport

if TYPE_CHECKING:
    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20
_PROVIDER = "QNNExecutionProvider"


class QnnTarget(Target):
    """ONNX models on a Snapdragon's Hexagon NPU (HTP)."""

    name: ClassVar[str] = "qnn"
    display_name: ClassVar[str] = "Qualcomm QNN via ONNX Runtime"
    devices: ClassVar[str] = "Snapdragon phones and laptops (Hexagon NPU)"
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[onnx]'"
    sdk_modules: ClassVar[tuple[str, ...]] = ("onnxruntime",)
    distribution: ClassVar[str] = "onnxruntime"
    runs: ClassVar[bool] = False
    runtime_note: ClassVar[str] = (
        "edgekit plans for this target, but running its models is not built yet "
        "(planned in edgekit issue 15)"
    )
    evaluates: ClassVar[bool] = False
    # No measurement here: bandwidth efficiency from public token-generation figures,
    # lower than a GPU's (NPU LLM pipelines are younger); ~200 MB of HTP shared buffers;
    # static shapes, so the KV cache is sized when the graph is compiled.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="npu",
            formats=("INT8", "INT4"),
            priors=Coefficients(
                bandwidth_efficiency=0.4,
                token_overhead_s=0.003,
                compute_efficiency=0.2,
                runtime_bytes=200 * MB,
                weight_residency=1.0,
                kv_preallocated=True,
            ),
        ),
    )

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's Hexagon tensor processor (runtime device ``HTP``)."""
        return [a for a in profile.accelerators if a.runtime_device == "HTP"]

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """Whether this onnxruntime has the QNN execution provider (onnxruntime-qnn)."""
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if _PROVIDER in providers:
            return True, f"{_PROVIDER} available"
        return False, (
            f"onnxruntime has no {_PROVIDER} (it ships in onnxruntime-qnn, on Snapdragon "
            f"devices); providers here: {', '.join(providers)}"
        )
