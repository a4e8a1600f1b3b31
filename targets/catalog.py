"""Every edgekit target as a row of data: what it runs, on what, with which SDK.

Nothing here imports a runtime SDK. ``availability`` checks a row against the host,
importing the SDK only then, and says why a target cannot run when it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TargetInfo:
    name: str
    display_name: str
    devices: str  # where it runs, in words
    formats: tuple[str, ...]  # bundle formats it loads
    quantizations: tuple[str, ...]
    install_hint: str  # how to get its SDK
    sdk_modules: tuple[str, ...]  # top-level modules it imports


TARGETS: tuple[TargetInfo, ...] = (
    TargetInfo(
        name="llamacpp",
        display_name="llama.cpp (GGUF)",
        devices="any CPU (x86 AVX2/AVX-512, Arm NEON); Metal, CUDA or Vulkan GPUs when built so",
        formats=("gguf",),
        quantizations=(
            "F32",
            "F16",
            "BF16",
            "Q8_0",
            "Q6_K",
            "Q5_K_M",
            "Q5_K_S",
            "Q4_K_M",
            "Q4_K_S",
            "Q4_0",
            "IQ4_NL",
            "Q3_K_M",
            "Q2_K",
        ),
        install_hint="pip install 'edgekit[gguf]'",
        sdk_modules=("llama_cpp",),
    ),
    TargetInfo(
        name="openvino",
        display_name="Intel OpenVINO",
        devices="Intel CPUs, integrated and Arc GPUs, Core Ultra NPUs",
        formats=("openvino",),
        quantizations=("F16", "INT8", "INT4"),
        install_hint="pip install 'edgekit[openvino]'",
        sdk_modules=("openvino", "openvino_genai"),
    ),
    TargetInfo(
        name="qnn",
        display_name="Qualcomm QNN via ONNX Runtime",
        devices="Snapdragon phones and laptops (Hexagon NPU)",
        formats=("onnx",),
        quantizations=("INT8", "INT4"),
        install_hint="pip install 'edgekit[onnx]'",
        sdk_modules=("onnxruntime",),
    ),
    TargetInfo(
        name="mlx",
        display_name="Apple MLX",
        devices="Apple silicon Macs (Metal); Linux CPU for development",
        formats=("mlx",),
        quantizations=("F16", "BF16", "8bit", "4bit"),
        install_hint="pip install 'edgekit[mlx]'",
        sdk_modules=("mlx", "mlx_lm"),
    ),
    TargetInfo(
        name="tensorrt",
        display_name="NVIDIA TensorRT",
        devices="NVIDIA GPUs and Jetson",
        formats=("tensorrt",),
        quantizations=("F16", "INT8", "INT4"),
        # No pip extra: PyPI's tensorrt downloads from NVIDIA at install time; it comes with
        # JetPack on a Jetson and with NVIDIA's own wheels on a desktop GPU.
        install_hint="install TensorRT from JetPack (Jetson) or NVIDIA's wheels (GPU hosts)",
        sdk_modules=("tensorrt",),
    ),
)

BY_NAME = {t.name: t for t in TARGETS}
