"""The memory an Edge-LLM engine build needs, checked before it starts.

On a Jetson the GPU shares the system's memory, so the available figure is the system's;
on a discrete GPU it is NVML's free memory of the device the runtime uses. edgekit.load
admits the variant by the planner's formula first (weights, KV cache, runtime); the build
adds TensorRT's builder workspace on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.errors import InsufficientMemoryError

if TYPE_CHECKING:
    from edgekit.converters.tensorrt.folder import ExportFolder
    from edgekit.converters.tensorrt.settings import EngineSettings
    from edgekit.targets.tensorrt_engine import DeviceFacts

GIB = 1 << 30
RUNTIME_BYTES = 500 << 20  # the target's prior: CUDA context and engine buffers
WORKSPACE_BYTES = 1 << 30  # TensorRT's builder workspace (tactic scratch memory)


@dataclass(frozen=True, kw_only=True)
class BuildMemory:
    weights: int
    kv_cache: int
    runtime: int
    workspace: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.runtime + self.workspace


def build_memory(folder: ExportFolder, settings: EngineSettings) -> BuildMemory:
    """The memory a build and the engine it makes are predicted to take: the export's
    weights (model.onnx.data and the embedding, f16), the KV cache at max_batch x
    capacity (K and V, fp16: 2 bytes), the runtime's buffers and the builder's workspace."""
    c = folder.config
    kv = (
        settings.max_batch_size
        * settings.max_kv_cache_capacity
        * int(c["num_hidden_layers"])
        * 2
        * int(c["num_key_value_heads"])
        * int(c["head_dim"])
        * 2
    )
    return BuildMemory(
        weights=folder.data_bytes + folder.onnx_bytes + folder.embedding_bytes,
        kv_cache=kv,
        runtime=RUNTIME_BYTES,
        workspace=WORKSPACE_BYTES,
    )


def check_build_memory(need: BuildMemory, device: DeviceFacts, settings: EngineSettings) -> None:
    """Refuse a build predicted not to fit, before it starts, with the figures.

    Raises:
        InsufficientMemoryError: ``need`` exceeds what ``device`` has available.
    """
    if need.total <= device.available_bytes:
        return
    raise InsufficientMemoryError(
        f"building the TensorRT engine needs about {need.total / GIB:.1f} GiB (weights "
        f"{need.weights / GIB:.1f}, KV cache {need.kv_cache / GIB:.1f} at batch "
        f"{settings.max_batch_size} x {settings.max_kv_cache_capacity} tokens, runtime "
        f"{need.runtime / GIB:.1f}, builder workspace {need.workspace / GIB:.1f}); "
        f"{device.device} has {device.available_bytes / GIB:.1f} GiB available",
        hint="free memory, or load with a smaller max_input / max_output / max_batch, "
        "or use a smaller model",
    )
