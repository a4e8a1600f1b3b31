"""Intel GPUs and NPUs, as OpenVINO lists them (only when OpenVINO is installed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class OpenVinoDevice:
    device: str  # "CPU", "GPU.0", "NPU"
    name: str  # FULL_DEVICE_NAME


class OpenVinoUnavailable(Exception):
    """OpenVINO is not installed or failed to list devices; the message says why."""


def list_openvino_devices() -> tuple[OpenVinoDevice, ...]:
    """Devices OpenVINO can run on here. Imports openvino: call from the probe only."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise OpenVinoUnavailable(
            "openvino is not installed (pip install 'edgekit[openvino]')"
        ) from exc
    try:
        core = ov.Core()
        return tuple(
            OpenVinoDevice(device=d, name=str(core.get_property(d, "FULL_DEVICE_NAME")))
            for d in core.available_devices
        )
    except RuntimeError as exc:
        raise OpenVinoUnavailable(f"OpenVINO could not list devices: {exc}") from exc
