"""What the QNN target finds on this host: ONNX Runtime's execution providers, the
onnxruntime-qnn plug-in and the QNN SDK it carries, and on a Snapdragon its SoC and HTP
architecture.

onnxruntime-qnn 2.x is a plug-in execution provider: a shared library that ONNX Runtime
loads when asked (``register_execution_provider_library``), found the way the package
documents it (``onnxruntime_qnn.get_library_path()``). It is registered once per process,
with ONNX Runtime (so ``get_ep_devices`` lists the HTP) and with onnxruntime-genai before
a session on it. A plug-in that is absent, names a library that is not there or fails to
load is reported, never raised: the target then runs on the CPU provider.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.onnx.socs import SOCS, Soc

EP_NAME = "QNNExecutionProvider"
PLUGIN_MODULE = "onnxruntime_qnn"
SOC_FILE = "sys/devices/soc0/machine"


@dataclass(frozen=True, kw_only=True)
class Plugin:
    """The onnxruntime-qnn plug-in as found here."""

    installed: bool
    registered: bool  # ONNX Runtime loaded its library
    library: str = ""
    version: str = ""  # the plug-in package's
    qnn_sdk: str = ""  # the QNN SDK version it was built with
    why: str = ""  # why it is not registered

    def describe(self) -> str:
        if not self.installed:
            return f"no {PLUGIN_MODULE} (the QNN execution provider, for Snapdragon devices)"
        sdk = f", QNN SDK {self.qnn_sdk}" if self.qnn_sdk else ""
        state = "registered" if self.registered else f"not registered: {self.why}"
        return f"{PLUGIN_MODULE} {self.version or '?'}{sdk}: {state}"


_LOCK = threading.Lock()
_REGISTERED: dict[str, Plugin] = {}  # one registration per process, by the library's API


def plugin(ort: Any) -> Plugin:
    """The plug-in, registered with ONNX Runtime (``ort``) the first time this is asked."""
    with _LOCK:
        if "ort" not in _REGISTERED:
            _REGISTERED["ort"] = _register(ort.register_execution_provider_library)
        return _REGISTERED["ort"]


def register_with_genai(og: Any, found: Plugin) -> None:
    """Register the plug-in's library with onnxruntime-genai too (once). When both share
    one ONNX Runtime environment the library is already known there, which is no error."""
    with _LOCK:
        if "og" in _REGISTERED or not found.registered:
            return
        try:
            og.register_execution_provider_library(EP_NAME, found.library)
        except Exception as exc:  # noqa: BLE001 - reported: the session says what failed
            if "already" not in str(exc).lower():
                raise
        _REGISTERED["og"] = found


def _register(register: Any) -> Plugin:
    try:
        module = importlib.import_module(PLUGIN_MODULE)
    except ImportError:
        return Plugin(installed=False, registered=False)
    version = str(getattr(module, "__version__", ""))
    info = getattr(module, "build_and_package_info", None)
    sdk = str(getattr(info, "qnn_version", "") or "")
    found: dict[str, Any] = {"installed": True, "version": version, "qnn_sdk": sdk}
    try:
        library = str(module.get_library_path())
    except Exception as exc:  # noqa: BLE001 - a broken package is reported, not raised
        return Plugin(**found, registered=False, why=f"get_library_path() failed: {exc}")
    if not Path(library).is_file():
        return Plugin(**found, registered=False, library=library, why=f"{library} is not a file")
    try:
        register(EP_NAME, library)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime refused the library: reported
        # registered before in this process (a registration forgotten here, or made by
        # the caller's own code): ONNX Runtime has it, which is what is asked
        if "already registered" not in str(exc):
            return Plugin(**found, registered=False, library=library, why=str(exc)[:300])
    return Plugin(**found, registered=True, library=library)


def forget_registration() -> None:
    """Forget what was registered (tests that install a fake plug-in)."""
    with _LOCK:
        _REGISTERED.clear()


def qnn_present(ort: Any) -> bool:
    """Whether the QNN execution provider can run on an HTP here: the plug-in pairs with
    an NPU device (on an x86 host it registers, and lists only the CPU, which its wheel
    has no backend for), or a QNN provider built into ONNX Runtime on a Snapdragon."""
    if plugin(ort).registered:
        return any(
            d.ep_name == EP_NAME and device_kind(d.device) == "npu" for d in ort.get_ep_devices()
        )
    return EP_NAME in ort.get_available_providers() and host_soc() is not None


def device_kind(hardware: Any) -> str:
    """An ONNX Runtime hardware device's type as the planner names units (cpu/gpu/npu)."""
    return str(getattr(hardware.type, "name", hardware.type)).lower()


def host_soc(root: Path = Path("/")) -> Soc | None:
    """The Snapdragon this runs on (its /sys/devices/soc0/machine, a part number of the
    SoC table the HTP builder compiles for), or None."""
    try:
        machine = (root / SOC_FILE).read_bytes()[:64].decode("ascii", "replace").strip()
    except OSError:
        return None
    return SOCS.get(machine.upper())


def soc_named(soc_model: object) -> Soc | None:
    """The SoC whose QNN ``soc_model`` id is ``soc_model`` (a provider option's text)."""
    return next((s for s in SOCS.values() if str(s.soc_model) == str(soc_model)), None)
