"""A minimal NVML binding through ctypes: GPU names, memory and power, no extra package.

NVML ships with the NVIDIA driver (libnvidia-ml.so.1, nvml.dll). Only the handful of
calls edgekit needs are bound; every failure becomes ``NvmlUnavailable`` with the reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass


class NvmlUnavailable(Exception):
    """NVML is absent or failed; the message says why."""


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


@dataclass(frozen=True, kw_only=True)
class NvidiaGpu:
    index: int
    name: str
    memory_bytes: int
    power_limit_w: float | None


def _library() -> ctypes.CDLL:
    names = ["nvml.dll"] if sys.platform == "win32" else ["libnvidia-ml.so.1"]
    found = ctypes.util.find_library("nvidia-ml")
    if found:
        names.append(found)
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise NvmlUnavailable("NVML library (libnvidia-ml) not found: no NVIDIA driver")


class Nvml:
    """An initialised NVML session; use as a context manager."""

    def __init__(self) -> None:
        self.lib = _library()
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")

    def _check(self, rc: int, call: str) -> None:
        if rc != 0:
            raise NvmlUnavailable(f"{call} failed with NVML error {rc}")

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.lib.nvmlShutdown()

    def handle(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)), "GetHandle")
        return h

    def count(self) -> int:
        n = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount")
        return n.value

    def gpu(self, index: int) -> NvidiaGpu:
        h = self.handle(index)
        name = ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlDeviceGetName(h, name, 96), "nvmlDeviceGetName")
        mem = _Memory()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)), "GetMemoryInfo")
        limit = ctypes.c_uint()
        rc = self.lib.nvmlDeviceGetPowerManagementLimit(h, ctypes.byref(limit))
        return NvidiaGpu(
            index=index,
            name=name.value.decode(errors="replace"),
            memory_bytes=int(mem.total),
            power_limit_w=limit.value / 1000 if rc == 0 else None,
        )

    def energy_j(self, index: int) -> float | None:
        """Total energy since the driver loaded (Volta and newer), or None if unsupported."""
        mj = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle(index), ctypes.byref(mj))
        return mj.value / 1000 if rc == 0 else None

    def power_w(self, index: int) -> float:
        mw = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.handle(index), ctypes.byref(mw)), "Power")
        return mw.value / 1000


def list_nvidia_gpus() -> tuple[NvidiaGpu, ...]:
    """Every NVIDIA GPU NVML sees. Raises NvmlUnavailable with the reason."""
    with Nvml() as nvml:
        return tuple(nvml.gpu(i) for i in range(nvml.count()))
