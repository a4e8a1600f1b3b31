"""NVIDIA Jetson: the board model from the device tree and the nvpmodel power mode."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class JetsonFacts:
    model: str
    power_mode: str | None  # the nvpmodel mode name, e.g. "15W" or "MAXN_SUPER"
    power_mode_id: int | None


def read_jetson(root: Path = Path("/")) -> JetsonFacts | None:
    """The Jetson this is, or None on any other machine.

    The model string is /proc/device-tree/model. The active power mode id is recorded by
    nvpmodel in /var/lib/nvpmodel/status ("pmode:0001 fmode:..."), and its name is the
    matching ``< POWER_MODEL ID=1 NAME=15W >`` line of /etc/nvpmodel.conf.
    """
    model_file = root / "proc/device-tree/model"
    if not model_file.is_file():
        return None
    model = model_file.read_bytes().rstrip(b"\x00\n").decode(errors="replace")
    if "jetson" not in model.lower() and "nvidia" not in model.lower():
        return None
    mode_id: int | None = None
    status = root / "var/lib/nvpmodel/status"
    if status.is_file():
        m = re.search(r"pmode:(\d+)", status.read_text(errors="replace"))
        mode_id = int(m.group(1)) if m else None
    mode_name: str | None = None
    conf = root / "etc/nvpmodel.conf"
    if mode_id is not None and conf.is_file():
        for m in re.finditer(
            r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>", conf.read_text(errors="replace")
        ):
            if int(m.group(1)) == mode_id:
                mode_name = m.group(2)
                break
    return JetsonFacts(model=model, power_mode=mode_name, power_mode_id=mode_id)


def read_board_model(root: Path = Path("/")) -> str | None:
    """The device-tree model of an Arm board (Raspberry Pi, Jetson), if there is one."""
    f = root / "proc/device-tree/model"
    if f.is_file():
        return f.read_bytes().rstrip(b"\x00\n").decode(errors="replace") or None
    return None
