"""The TensorRT Edge-LLM format package: the portable ONNX export of NVIDIA's
``tensorrt-edgellm-export`` plus the engine build settings (``engine.json``); the target
builds the engine from it on the device.

``FORMAT`` describes it (precisions, per-tensor layout, the export edge); ``socs`` is the
per-chip precision table, ``settings`` the engine settings, ``folder`` the checked
variant folder, ``export`` the conversion (in the isolated tool environment of
``tool_env``). Importing the package imports no SDK.
"""

from __future__ import annotations

from edgekit.converters.tensorrt.format import SCHEMES, TensorRtFormat

FORMAT = TensorRtFormat()

__all__ = ["FORMAT", "SCHEMES", "TensorRtFormat"]
