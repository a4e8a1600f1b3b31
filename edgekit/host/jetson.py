"""NVIDIA Jetson: the board model from the device tree and the nvpmodel power mode.

nvpmodel (NVIDIA Jetson Linux Developer Guide, "Power Mode Controls") keeps the mode it
last set in /var/lib/nvpmodel/status (``pmode:0002``, sometimes followed by ``fmode:...``)
and reads its modes from /etc/nvpmodel.conf: ``< POWER_MODEL ID=2 NAME=MAXN_SUPER >``
sections and one ``< PM_CONFIG DEFAULT=1 >``, the mode used while no status file exists.
On JetPack 5 and 6 /etc/nvpmodel.conf is a link to the board's own file, e.g.
/etc/nvpmodel/nvpmodel_p3767_0003_super.conf (Orin Nano 8 GB, Super modes); the link is
followed inside the root (edgekit.host.sysfs) and the file it names is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgekit.host.sysfs import (
    MAX_CONF_BYTES,
    TreeError,
    TreeMissing,
    read_label,
    read_text,
    resolve,
)

STATUS = "var/lib/nvpmodel/status"
CONF = "etc/nvpmodel.conf"
MAX_MODES = 64
_MODE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d{1,4})\s+NAME=([A-Za-z0-9_.+-]{1,40})\s*>")
_DEFAULT = re.compile(r"<\s*PM_CONFIG\s+DEFAULT=(\d{1,4})\s*>")
_PMODE = re.compile(r"(?:^|\s)pmode:(\d{1,4})(?:\s|$)")


@dataclass(frozen=True, kw_only=True)
class NvpMode:
    id: int
    name: str


@dataclass(frozen=True, kw_only=True)
class JetsonFacts:
    model: str
    power_mode: str | None  # the nvpmodel mode name, e.g. "15W" or "MAXN_SUPER"
    power_mode_id: int | None
    modes: tuple[NvpMode, ...] = ()  # every mode the conf defines, in its order
    default_mode_id: int | None = None  # the conf's PM_CONFIG DEFAULT
    conf: str | None = None  # the conf file nvpmodel reads (the link's target), from /
    mode_note: str = ""  # where the mode came from, or why it is unknown


def read_jetson(root: Path = Path("/")) -> JetsonFacts | None:
    """The Jetson this is, or None on any other machine. Never raises: a file that cannot be
    read leaves its fact None, with the reason in ``mode_note``."""
    try:
        model = read_label(root, "proc/device-tree/model")
    except TreeError:
        return None
    if "jetson" not in model.lower() and "nvidia" not in model.lower():
        return None
    notes: list[str] = []
    modes, default, conf = _read_conf(root, notes)
    mode_id, absent = _read_status(root, notes)
    # nvpmodel applies the conf's default while it has recorded no mode; an unreadable
    # record leaves the mode unknown rather than guessed
    if absent and default is not None:
        mode_id = default
        notes.append(f"no mode recorded: the conf's default, mode {default}")
    name = next((m.name for m in modes if m.id == mode_id), None)
    if mode_id is not None and name is None and modes:
        notes.append(f"mode {mode_id} is not defined in {conf}")
    return JetsonFacts(
        model=model,
        power_mode=name,
        power_mode_id=mode_id,
        modes=modes,
        default_mode_id=default,
        conf=conf,
        mode_note="; ".join(notes),
    )


def _read_status(root: Path, notes: list[str]) -> tuple[int | None, bool]:
    """The mode nvpmodel recorded, and whether there is no record at all."""
    try:
        text = read_text(root, STATUS)
    except TreeMissing:
        notes.append(f"no /{STATUS}")
        return None, True
    except TreeError as exc:
        notes.append(str(exc))
        return None, False
    m = _PMODE.search(text)
    if not m:
        notes.append(f"/{STATUS} holds no pmode:NNNN")
        return None, False
    notes.append(f"mode {int(m.group(1))} from /{STATUS}")
    return int(m.group(1)), False


def _read_conf(root: Path, notes: list[str]) -> tuple[tuple[NvpMode, ...], int | None, str | None]:
    """The modes and the default of the conf nvpmodel reads, and that file's path."""
    try:
        real = resolve(root, CONF)
        text = read_text(root, CONF, max_bytes=MAX_CONF_BYTES)
    except TreeError as exc:  # missing, or the link's target missing or outside the root
        notes.append(str(exc))
        return (), None, None
    where = "/" + real.relative_to(root).as_posix()
    modes: dict[int, NvpMode] = {}
    default: int | None = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):  # the format's own description quotes a section header
            continue
        if m := _MODE.fullmatch(line):
            mode = NvpMode(id=int(m.group(1)), name=m.group(2))
            modes.setdefault(mode.id, mode)
        elif m := _DEFAULT.fullmatch(line):
            default = int(m.group(1))
        if len(modes) > MAX_MODES:
            notes.append(f"{where}: more than {MAX_MODES} power modes")
            return (), None, where
    if not modes:
        notes.append(f"{where} defines no POWER_MODEL")
    return tuple(modes.values()), default, where


def read_board_model(root: Path = Path("/")) -> str | None:
    """The device-tree model of an Arm board (Raspberry Pi, Jetson), if there is one."""
    try:
        return read_label(root, "proc/device-tree/model")
    except TreeError:
        return None
