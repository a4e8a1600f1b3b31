"""The isolated tool environment the Edge-LLM export runs in.

``tensorrt-edgellm[export]`` pins transformers 5.14.1 and onnx 1.19.0, which edgekit's
own environment cannot hold beside the OpenVINO stack (transformers <= 5.5): the export
runs from its own virtual environment (``edgekit tools install tensorrt-export``, or
``.ci/setup``), created from the pins in ``export-requirements.txt``. torch comes first
and pinned; pip takes the CPU build where one is on its path (this project's machines),
else PyPI's, which on x86_64 Linux is the CUDA build (docs/tensorrt.md says how to avoid it).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.tool_envs import ToolEnv

EXPORT_SCRIPT = "tensorrt-edgellm-export"
EXPORT_ENV = ToolEnv(
    name="tensorrt-export",
    requirements=Path(__file__).with_name("export-requirements.txt"),
    scripts=(EXPORT_SCRIPT,),
    description="NVIDIA TensorRT Edge-LLM exporter (HF folder -> Edge-LLM ONNX export; "
    "torch, transformers 5.14.1, onnx 1.19.0; about 1.8 GB with torch's CPU build)",
)
