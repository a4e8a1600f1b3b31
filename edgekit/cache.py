"""Where edgekit keeps what it makes for later (extracted bundles, calibration, quality
figures, bench results): $EDGEKIT_CACHE, else ~/.cache/edgekit."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE") or Path.home() / ".cache" / "edgekit")
