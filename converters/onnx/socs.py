"""Snapdragon SoCs edgekit builds QNN HTP variants for, and how QNN names them.

Keys are the part numbers ``/sys/devices/soc0/machine`` reports on the device (and what
``--recipe soc=...`` and the device profiles' ``soc`` name). ``soc_model`` is QNN's
``soc_model`` provider option and ``htp_arch`` its ``htp_arch`` (the Hexagon tensor
processor generation), from Qualcomm's SoC table for the QNN SDK. Host-compiled context
binaries are reported to work on v73 and newer only, so older SoCs are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import UnsupportedConversionError


@dataclass(frozen=True, kw_only=True)
class Soc:
    key: str  # "SM8750"
    name: str  # "Snapdragon 8 Elite"
    soc_model: int
    htp_arch: int


SOCS: dict[str, Soc] = {
    soc.key: soc
    for soc in (
        Soc(key="SM8550", name="Snapdragon 8 Gen 2", soc_model=43, htp_arch=73),
        Soc(key="SM8650", name="Snapdragon 8 Gen 3", soc_model=57, htp_arch=75),
        Soc(key="SM8750", name="Snapdragon 8 Elite", soc_model=69, htp_arch=79),
        Soc(key="SC8380XP", name="Snapdragon X Elite", soc_model=60, htp_arch=73),
    )
}


def require_soc(key: object) -> Soc:
    """The SoC ``key`` names (any case).

    Raises:
        UnsupportedConversionError: not a SoC edgekit builds for (checked before writing).
    """
    found = SOCS.get(key.upper()) if isinstance(key, str) else None
    if found is None:
        raise UnsupportedConversionError(
            f"soc={key!r} is not a Snapdragon SoC edgekit builds HTP variants for",
            hint=f"use one of {', '.join(SOCS)} (or pack --device with a Snapdragon profile)",
        )
    return found
