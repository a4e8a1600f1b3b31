"""Which precisions TensorRT Edge-LLM runs on which NVIDIA chip: data, not branches.

A device profile's accelerator names its chip in ``soc`` ("ORIN", "AD102"...); the
planner offers, and the export accepts, only the precisions that chip's SM runs, so an
Orin is never offered FP8. The rule behind the table (NVIDIA's support matrix): FP16,
INT8 (SmoothQuant) and INT4 (AWQ) run on every supported SM (Ampere SM80+, Jetson Orin
SM87 included); FP8 needs Ada SM89 or newer; NVFP4 needs Blackwell SM100 or newer.
Each row names where its SM comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import ModelError

# The precisions in the order of the table (the format's quant names).
F16, INT8, INT4, FP8, NVFP4 = "F16", "INT8", "INT4", "FP8", "NVFP4"
PRECISIONS = (F16, INT8, INT4, FP8, NVFP4)
FP8_SM = 89  # Ada: the first SM with FP8 tensor cores
NVFP4_SM = 100  # Blackwell: the first with FP4 tensor cores

_MATRIX = (
    "nvidia.github.io/TensorRT-Edge-LLM supported models, precision support (FP16 on all "
    "platforms, FP8 SM89+, NVFP4 Blackwell SM100+; Jetson Orin runs FP16, INT8, INT4 only)"
)
_CC = "developer.nvidia.com/cuda-gpus"


@dataclass(frozen=True)
class Chip:
    """One chip: its key (a profile's ``soc``), name, SM (compute capability x10), the
    precisions it runs, and where that comes from."""

    key: str
    name: str
    sm: int
    precisions: tuple[str, ...]
    source: str


def precisions_for_sm(sm: int) -> tuple[str, ...]:
    """The precisions an SM (compute capability x10) runs, by the support matrix's rule."""
    out = [F16, INT8, INT4]
    if sm >= FP8_SM:
        out.append(FP8)
    if sm >= NVFP4_SM:
        out.append(NVFP4)
    return tuple(out)


def _chip(key: str, name: str, sm: int, source: str) -> Chip:
    return Chip(
        key=key, name=name, sm=sm, precisions=precisions_for_sm(sm), source=f"{source}; {_MATRIX}"
    )


CHIPS: dict[str, Chip] = {
    c.key: c
    for c in (
        _chip(
            "ORIN",
            "Jetson Orin (Ampere GPU)",
            87,
            f"{_CC}: Jetson AGX Orin, Orin NX, Orin Nano 8.7",
        ),
        _chip(
            "THOR", "Jetson Thor (Blackwell GPU)", 110, f"{_CC}: Jetson T5000/T4000 11.0 (CUDA 13)"
        ),
        _chip("GA102", "GeForce RTX 30xx (Ampere GA102)", 86, f"{_CC}: GeForce RTX 3090/3080 8.6"),
        _chip("AD102", "GeForce RTX 4090 (Ada AD102)", 89, f"{_CC}: GeForce RTX 4090 8.9"),
        _chip("GB202", "GeForce RTX 50xx (Blackwell GB202)", 120, f"{_CC}: GeForce RTX 5090 12.0"),
        _chip("GH100", "H100 / H200 (Hopper GH100)", 90, f"{_CC}: H100, H200 9.0"),
    )
}


def chip(key: str) -> Chip:
    """The chip ``key`` (any case).

    Raises:
        ModelError: edgekit has no precision row for it (the hint lists those it has).
    """
    found = CHIPS.get(key.strip().upper()) if isinstance(key, str) else None
    if found is None:
        raise ModelError(
            f"TensorRT Edge-LLM: no precision table row for chip {key!r}",
            hint=f"use one of {', '.join(CHIPS)} (a device profile's accelerator soc)",
        )
    return found


def precisions_for(key: str) -> tuple[str, ...]:
    """The precisions chip ``key`` runs.

    Raises:
        ModelError: an unknown chip (see ``chip``).
    """
    return chip(key).precisions
