"""Host memory: total, available, and a short measured copy bandwidth."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, kw_only=True)
class MemoryFacts:
    total_bytes: int
    available_bytes: int


def read_memory() -> MemoryFacts:
    vm = psutil.virtual_memory()
    return MemoryFacts(total_bytes=int(vm.total), available_bytes=int(vm.available))


def measure_copy_bandwidth(size_mib: int = 256, repeats: int = 5) -> float:
    """Memory bandwidth in GB/s from a large single-threaded copy (best of ``repeats``).

    A copy reads and writes every byte, so 2 x size bytes cross the memory bus per pass.
    One thread does not saturate every channel of a big server, so this is a lower bound
    of the spec figure, and close to what one decoding thread sees.
    """
    n = size_mib << 20
    # Touch both buffers first so page faults are not timed.
    src = bytearray(b"\x01") * n
    dst = bytearray(n)
    dst[:] = src
    view_src, view_dst = memoryview(src), memoryview(dst)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        view_dst[:] = view_src
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best / 1e9
