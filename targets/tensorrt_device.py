"""What a TensorRT Edge-LLM engine is specific to, read on this host, and Edge-LLM's own
engine builder.

- The TensorRT version: ``getInferLibVersion`` of the libnvinfer this process loaded
  (the one the Edge-LLM runtime links; found in /proc/self/maps, so a second TensorRT on
  the library path cannot be mistaken for it).
- The device: on a Jetson the device-tree board model and the SoC (``compatible``'s
  tegra part: tegra234 is Orin); elsewhere the CUDA driver's name and compute capability
  of device 0, the GPU Edge-LLM runs on.
- The memory a build may take: on a Jetson the system's available memory (CPU and GPU
  share it), elsewhere NVML's free memory of that GPU (found by its UUID).
- The nvpmodel power mode of a Jetson, which the session reports.

Nothing here imports the SDK; ``NativeBuilder`` is handed the native module.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from edgekit.converters.tensorrt.settings import EngineSettings
from edgekit.converters.tensorrt.socs import CHIPS
from edgekit.targets.tensorrt_engine import DeviceFacts

from edgekit.host.jetson import read_jetson
from edgekit.host.memory import read_memory
from edgekit.host.nvml import Nvml, NvmlUnavailable
from edgekit.host.sysfs import TreeError, read_text

DISTRIBUTION = "tensorrt-edgellm"
_LIBNVINFER = re.compile(r"^libnvinfer\.so(\.\d+)*$")
_TEGRA = {"tegra234": "ORIN", "tegra264": "THOR", "tegra194": "XAVIER"}
COMPATIBLE_BYTES = 4096
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
MAPS_BYTES = 16 << 20


class DeviceUnknown(Exception):
    """The device cannot be identified; the message says why."""


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def loaded_libnvinfer(maps: str) -> str | None:
    """The path of the libnvinfer mapped in a process, from its /proc/<pid>/maps text."""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and _LIBNVINFER.match(Path(parts[5].strip()).name):
            return parts[5].strip()
    return None


def version_text(encoded: int) -> str:
    """TensorRT's NV_TENSORRT_VERSION as text: major * 10000 + minor * 100 + patch from
    TensorRT 10 on, major * 1000 + minor * 100 + patch before (8601 is 8.6.1; JetPack 5
    ships TensorRT 8.5)."""
    if encoded >= 100000:
        return f"{encoded // 10000}.{encoded // 100 % 100}.{encoded % 100}"
    return f"{encoded // 1000}.{encoded // 100 % 10}.{encoded % 100}"


def tensorrt_version(maps_file: Path = Path("/proc/self/maps")) -> str:
    """The version of the libnvinfer this process loaded (after the runtime loaded).

    Raises:
        DeviceUnknown: no libnvinfer is loaded, or it has no getInferLibVersion.
    """
    try:
        with open(maps_file, "rb") as f:
            maps = f.read(MAPS_BYTES).decode(errors="replace")
    except OSError as exc:
        raise DeviceUnknown(f"cannot read {maps_file}: {exc.strerror}") from exc
    path = loaded_libnvinfer(maps)
    if path is None:
        raise DeviceUnknown("no libnvinfer is loaded: the Edge-LLM runtime did not load TensorRT")
    try:
        lib = ctypes.CDLL(path)  # already mapped: dlopen returns that very library
        call = lib.getInferLibVersion
    except (OSError, AttributeError) as exc:
        raise DeviceUnknown(f"{path} has no getInferLibVersion: {exc}") from exc
    call.restype = ctypes.c_int32
    return version_text(int(call()))


def jetson_soc(root: Path = Path("/")) -> str:
    """The Jetson's SoC from the device tree's ``compatible`` list ("ORIN" for tegra234),
    else the tegra part as written, else "unknown SoC"."""
    try:  # /proc/device-tree is a link: resolved inside root (a recorded tree's own)
        raw = read_text(root, "proc/device-tree/compatible", max_bytes=COMPATIBLE_BYTES)
    except TreeError:
        return "unknown SoC"
    for entry in raw.split("\0"):
        text = entry.strip()
        vendor, _, part = text.partition(",")
        if vendor == "nvidia" and part.startswith("tegra"):
            return _TEGRA.get(part, part.upper())
    return "unknown SoC"


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """The device an engine runs on, without the TensorRT version."""

    device: str
    available_bytes: int
    jetson: bool
    power_mode: str | None
    sm: int | None = None  # compute capability x10 (87 for an Orin); None: unknown


def find_gpu(root: Path = Path("/")) -> Gpu:
    """This host's Jetson module, or the CUDA device 0 the runtime runs on.

    Raises:
        DeviceUnknown: neither a Jetson nor a CUDA GPU (the reason CUDA or NVML gave).
    """
    jetson = read_jetson(root)
    if jetson is not None:
        soc = jetson_soc(root)
        return Gpu(
            device=f"{jetson.model} ({soc})",
            available_bytes=read_memory().available_bytes,
            jetson=True,
            power_mode=jetson.power_mode,
            sm=CHIPS[soc].sm if soc in CHIPS else None,
        )
    name, major, minor, uuid = cuda_device0()
    return Gpu(
        device=f"{name} (SM {major}.{minor})",
        available_bytes=_free_bytes(uuid),
        jetson=False,
        power_mode=None,
        sm=major * 10 + minor,
    )


def cuda_device0() -> tuple[str, int, int, bytes]:
    """Name, compute capability and UUID of CUDA device 0, as the CUDA driver orders
    devices (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER applied; NVML's order is the PCI
    bus's, which can differ on a host with several GPUs).

    Raises:
        DeviceUnknown: no CUDA driver, or it has no device.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DeviceUnknown(f"no CUDA driver (libcuda.so.1): {exc}") from exc
    dev = ctypes.c_int()
    major, minor = ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    uuid = (ctypes.c_char * 16)()
    for call, args in (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(dev), 0)),
        ("cuDeviceGetName", (name, 256, dev)),
        ("cuDeviceGetAttribute", (ctypes.byref(major), _CC_MAJOR, dev)),
        ("cuDeviceGetAttribute", (ctypes.byref(minor), _CC_MINOR, dev)),
        ("cuDeviceGetUuid", (uuid, dev)),
    ):
        rc = getattr(cuda, call)(*args)
        if rc != 0:
            raise DeviceUnknown(f"the CUDA driver's {call} failed with CUresult {rc}")
    return name.value.decode(errors="replace"), major.value, minor.value, bytes(uuid)


def nvml_uuid(raw: bytes) -> str:
    """A CUDA device UUID (16 bytes) as NVML writes it: GPU-8-4-4-4-12 hex digits."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _free_bytes(uuid: bytes) -> int:
    """NVML's free memory of the GPU with ``uuid``.

    Raises:
        DeviceUnknown: NVML is absent or does not know the GPU.
    """
    handle = ctypes.c_void_p()
    mem = _Memory()
    try:
        with Nvml() as nvml:
            rc = nvml.lib.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid).encode(), ctypes.byref(handle))
            if rc == 0:
                rc = nvml.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
    except NvmlUnavailable as exc:
        raise DeviceUnknown(f"cannot read the GPU's free memory: {exc}") from exc
    if rc != 0:
        raise DeviceUnknown(f"NVML could not read the memory of {nvml_uuid(uuid)} (error {rc})")
    return int(mem.free)


def edgellm_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


class NativeBuilder:
    """Edge-LLM's ``LLMBuilder`` and this host's facts (an ``EngineBuilder``)."""

    def __init__(self, rt: Any, root: Path = Path("/")) -> None:
        self._rt = rt
        self._root = root
        self.edgellm_version = edgellm_version()

    def facts(self) -> DeviceFacts:
        """Raises DeviceUnknown (the target turns it into a TargetError)."""
        gpu = find_gpu(self._root)
        return DeviceFacts(
            device=gpu.device, tensorrt=tensorrt_version(), available_bytes=gpu.available_bytes
        )

    def build(self, onnx_dir: Path, engine_dir: Path, settings: EngineSettings) -> bool:
        config = self._rt.LLMBuilderConfig()
        config.max_input_len = settings.max_input_len
        config.max_batch_size = settings.max_batch_size
        config.max_kv_cache_capacity = settings.max_kv_cache_capacity
        config.max_lora_rank = 0  # edgekit ships no LoRA adapters
        return bool(self._rt.LLMBuilder(str(onnx_dir), str(engine_dir), config).build())
