"""edgekit: put language models on edge devices.

The public API is imported lazily, so ``import edgekit`` stays fast and imports no
runtime SDK, no torch and no textual (tests/test_imports.py checks this in a subprocess).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "inspect_model": "edgekit.inspection",
    "ModelSpec": "edgekit.modelspec",
    "TensorInfo": "edgekit.modelspec",
    "DeviceProfile": "edgekit.devices",
    "load_profile": "edgekit.devices",
    "profile_names": "edgekit.devices",
    "probe_host": "edgekit.probe",
    "HostReport": "edgekit.probe",
    "default_model_path": "edgekit.default_model",
    "EdgekitError": "edgekit.errors",
    "load": "edgekit.runtime",
    "pack": "edgekit.bundle",
    "VariantRequest": "edgekit.bundle",
    "Sampling": "edgekit.targets.values",
}

__all__ = [
    "DeviceProfile",
    "EdgekitError",
    "HostReport",
    "Sampling",
    "VariantRequest",
    "ModelSpec",
    "TensorInfo",
    "__version__",
    "default_model_path",
    "inspect_model",
    "load",
    "load_profile",
    "pack",
    "probe_host",
    "profile_names",
]

if TYPE_CHECKING:
    from edgekit.bundle import VariantRequest, pack
    from edgekit.default_model import default_model_path
    from edgekit.devices import DeviceProfile, load_profile, profile_names
    from edgekit.errors import EdgekitError
    from edgekit.inspection import inspect_model
    from edgekit.modelspec import ModelSpec, TensorInfo
    from edgekit.probe import HostReport, probe_host
    from edgekit.runtime import load
    from edgekit.targets.values import Sampling


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgekit' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
