"""CPU model, core counts and instruction-set features of the host."""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

# /proc/cpuinfo flag (x86) or Features entry (arm) -> the ISA name edgekit reports.
# Only features that change which kernels an LLM runtime picks are listed.
ISA_FLAGS: dict[str, str] = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx",
    "amx_int8": "amx_int8",
    "amx_bf16": "amx_bf16",
    "asimd": "neon",
    "asimddp": "dotprod",
    "i8mm": "i8mm",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
    "fphp": "fp16",
    "bf16": "bf16",
}
# macOS sysctl hw.optional.* -> ISA name (Apple silicon)
_DARWIN_FLAGS: dict[str, str] = {
    "hw.optional.neon": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_FP16": "fp16",
    "hw.optional.arm.FEAT_SME": "sme",
    "hw.optional.arm.FEAT_SME2": "sme2",
}


@dataclass(frozen=True, kw_only=True)
class CpuFacts:
    model: str
    physical_cores: int
    logical_cores: int
    isa: tuple[str, ...]
    max_ghz: float | None
    performance_cores: int | None = None
    efficiency_cores: int | None = None


def parse_cpuinfo(text: str) -> tuple[str | None, tuple[str, ...]]:
    """The CPU model name and the ISA features edgekit cares about, from /proc/cpuinfo."""
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and model is None:
            model = value.strip() or None
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    isa = sorted({ISA_FLAGS[f] for f in flags if f in ISA_FLAGS})
    return model, tuple(isa)


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def read_cpu(root: Path = Path("/")) -> CpuFacts:
    """The host CPU. ``root`` lets tests point at a recorded /proc tree."""
    model: str | None = None
    isa: tuple[str, ...] = ()
    perf = eff = None
    cpuinfo = root / "proc/cpuinfo"
    if cpuinfo.is_file():
        model, isa = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    elif platform.system() == "Darwin":
        model = _sysctl("machdep.cpu.brand_string")
        isa = tuple(sorted(v for k, v in _DARWIN_FLAGS.items() if _sysctl(k) == "1"))
        p, e = _sysctl("hw.perflevel0.physicalcpu"), _sysctl("hw.perflevel1.physicalcpu")
        perf = int(p) if p and p.isdigit() else None
        eff = int(e) if e and e.isdigit() else None
    if not model:
        # Device-tree model names the board (Raspberry Pi, Jetson) when cpuinfo does not.
        model = platform.processor() or platform.machine() or "unknown CPU"
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    freq = None
    try:
        f = psutil.cpu_freq()
        if f and f.max:
            freq = round(f.max / 1000, 2)
    except (OSError, NotImplementedError, AttributeError):
        freq = None
    return CpuFacts(
        model=model,
        physical_cores=physical,
        logical_cores=logical,
        isa=isa,
        max_ghz=freq,
        performance_cores=perf,
        efficiency_cores=eff,
    )


def peak_fp32_gflops(facts: CpuFacts, ghz: float) -> float:
    """Peak fp32 GFLOP/s from cores x clock x FMA width: an estimate, never a measurement.

    AVX-512 FMA: 2 units x 16 lanes x 2 ops = 64 flops/cycle on server parts (32 on many
    clients); AVX2 FMA: 32; NEON: 4 FMA pipes x 4 lanes x 2 = 16 on big Arm cores.
    """
    if "avx512" in facts.isa:
        per_cycle = 32  # conservative: one 512-bit FMA unit
    elif "avx2" in facts.isa and "fma" in facts.isa:
        per_cycle = 32
    elif "neon" in facts.isa:
        per_cycle = 16
    else:
        per_cycle = 8
    return facts.physical_cores * ghz * per_cycle
