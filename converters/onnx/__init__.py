"""The ONNX format package: onnxruntime-genai model folders for ONNX Runtime.

``FORMAT`` describes it (quantizations, per-tensor layout, the build edge); ``export``
builds a Hugging Face folder with the onnxruntime-genai model builder for the CPU
execution provider. Importing the package imports no SDK: the build imports
onnxruntime-genai, torch and transformers when it runs.
"""

from __future__ import annotations

from edgekit.converters.onnx.format import OnnxFormat

FORMAT = OnnxFormat()

__all__ = ["FORMAT", "OnnxFormat"]
