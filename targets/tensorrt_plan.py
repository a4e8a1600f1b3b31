"""What the planner asks of the TensorRT Edge-LLM target: the precisions a device's chip
runs, the build options a variant for it records, and what of the build happens on the
device rather than here. ``targets/tensorrt.py`` delegates its planner classmethods to
these functions; nothing here imports the SDK (the planner calls them on any host).

The chip is the profile accelerator's ``soc`` ("ORIN", "AD102"), looked up in the
format's precision table (``edgekit.converters.tensorrt.socs``): an Orin is never offered
FP8, an RTX 4090 never NVFP4. A GPU whose chip the profile does not name, or that the
table does not know, is offered only the precisions every chip in the table runs: the
export is portable, but an engine of a precision its SM lacks fails to build on the
device, and the plan must not promise one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgekit.converters.tensorrt import FORMAT
from edgekit.converters.tensorrt.socs import CHIPS, Chip

if TYPE_CHECKING:
    from edgekit.devices import Accelerator, DeviceProfile

# What a build for a GPU leaves to the device (the plan's note on a buildable pick).
GPU_BUILD_NOTE = (
    "pack writes the portable Edge-LLM ONNX export and its engine settings; TensorRT "
    "builds the engine on the device at first load (minutes; engines are specific to the "
    "GPU and the TensorRT version), not on this host"
)


def known_chip(accelerator: Accelerator) -> Chip | None:
    """The table's row for ``accelerator``'s chip, or None (no soc, or one the table
    does not list)."""
    soc = accelerator.soc
    return CHIPS.get(soc.upper()) if soc else None


def everywhere() -> tuple[str, ...]:
    """The precisions every chip in the table runs (what an unnamed chip is offered)."""
    rows = list(CHIPS.values())
    if not rows:
        return ()
    return tuple(p for p in rows[0].precisions if all(p in c.precisions for c in rows[1:]))


def unit_formats(
    profile: DeviceProfile,
    accelerator: Accelerator,
    offered: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """``offered`` (the unit's formats; default: every quantization of the format, most
    bits first) narrowed to what ``accelerator`` of ``profile`` runs: its chip's
    precisions, or those every known chip runs."""
    if offered is None:
        quants = FORMAT.quants.values()
        offered = tuple(q.name for q in sorted(quants, key=lambda q: -q.bits_per_weight))
    found = known_chip(accelerator)
    runs = found.precisions if found is not None else everywhere()
    return tuple(f for f in offered if f in runs)


def build_recipe(profile: DeviceProfile, accelerator: Accelerator) -> str:
    """``soc=<chip>`` for a chip the table knows: the export records it in engine.json
    and checks the precision against it. "" otherwise (the engine settings then name no
    chip; only precisions every chip runs were offered)."""
    found = known_chip(accelerator)
    return f"soc={found.key}" if found is not None else ""


def build_note(kind: str) -> str:
    """What of a build for a ``kind`` unit happens on the device: the engine."""
    return GPU_BUILD_NOTE if kind == "gpu" else ""
