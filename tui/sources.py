"""What the TUI works on, and the seams tests replace (the host probe, the clock)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.cache import cache_root
from edgekit.probe import HostReport, probe_host


def default_results() -> Path:
    return cache_root() / "results"


def default_load_url() -> str:
    """Where `edgekit serve` listens when given no --host or --port: the Load tab's first
    guess at what to load."""
    from edgekit.serve_config import ServeConfig

    return f"http://{ServeConfig.host}:{ServeConfig.port}/v1"


def is_bundle(path: Path) -> bool:
    return (path / "manifest.json").is_file() or (path.is_file() and path.suffix == ".tar")


@dataclass(kw_only=True)
class Sources:
    """Shared, changing state of one TUI session (not a value: the tabs update it)."""

    model: Path | None = None  # what the Plan tab plans; None: the embedded default model
    bundle: Path | None = None  # what Bench and Chat load
    device: str = "host"  # a profile name, or the probed host
    results: Path = field(default_factory=default_results)  # saved bench results
    load_url: str = field(default_factory=default_load_url)  # the server the Load tab loads
    api_key: str | None = field(default=None, repr=False)  # the Load tab's bearer token
    probe: Callable[[], HostReport] = probe_host
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def from_argument(cls, target: Path | None, **kwargs: object) -> Sources:
        """``edgekit tui [MODEL_OR_BUNDLE]``: a bundle feeds Bench and Chat (and the plan
        uses its source model when that still exists); a model feeds the plan."""
        if target is not None and is_bundle(target):
            return cls(bundle=target, model=_bundle_model(target), **kwargs)  # type: ignore[arg-type]
        return cls(model=target, **kwargs)  # type: ignore[arg-type]

    def plan_model(self) -> Path:
        from edgekit.default_model import default_model_path

        return self.model if self.model is not None else default_model_path()


def _bundle_model(bundle: Path) -> Path | None:
    """The bundle's source model if it is still on disk, else its first variant's file."""
    from edgekit.bundle_open import open_bundle
    from edgekit.errors import EdgekitError

    try:
        opened = open_bundle(bundle)
    except EdgekitError:
        return None
    source = Path(opened.manifest.model.source.path)
    if source.exists():
        return source
    return opened.variant_path(opened.manifest.variants[0])
