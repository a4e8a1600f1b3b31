"""Fixtures of the target contract suite: one tiny variant per registered target.

The suite runs over every registered target that edgekit can run
(``edgekit.targets.registry.runnable_targets``): a new target gets it by registering.
``EDGEKIT_CONTRACT_TARGETS=name,name`` selects some of them (tests/test_contract_can_fail.py
runs the suite on a broken fake target that way).

Each target's variant is a tiny random Llama (tests/tiny_models.py) converted to the
target's format in its most precise lossless quantization (its default quantization when
it has none), built once per test session and loaded on the CPU. A target whose SDK is not
installed is skipped with the reason; with EDGEKIT_STRICT=1 that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters.formats import Quant
from edgekit.targets.contract import Target
from edgekit.targets.registry import get_target, runnable_targets

from edgekit.errors import TargetUnavailableError
from tests.conftest import STRICT, require

SELECT = "EDGEKIT_CONTRACT_TARGETS"
FAMILY = "llama"  # a family every format converts


def selected_targets() -> list[type[Target]]:
    """The targets the suite runs on: every runnable one, or those ``SELECT`` names."""
    names = [n.strip() for n in os.environ.get(SELECT, "").split(",") if n.strip()]
    if not names:
        return list(runnable_targets())
    chosen = [get_target(n) for n in names]  # TargetError names the installed ones
    idle = [t.name for t in chosen if not t.runs]
    if idle:
        raise pytest.UsageError(f"{SELECT} names targets edgekit cannot run: {', '.join(idle)}")
    return chosen


@dataclass(frozen=True, kw_only=True)
class Variant:
    """A built variant of the tiny model for one target."""

    target: type[Target]
    source: Path  # the Hugging Face folder it was converted from (the reference)
    path: Path  # what ``target.load`` takes: the entry file, or the variant folder
    quant: Quant

    def load(self, **settings: Any) -> Any:
        """A session on the CPU, with ``settings`` the target knows."""
        base = self.target.device_settings("cpu") if "cpu" in self.target.devices_accepted else {}
        return self.target.load(self.path, **{**base, **settings})

    def known(self, **settings: Any) -> dict[str, Any]:
        """The ``settings`` this target's ``load`` accepts (the rest are left out)."""
        return {k: v for k, v in settings.items() if k in self.target.load_settings}


def contract_quant(target: type[Target]) -> Quant:
    """The target format's most precise lossless quantization, else its default."""
    lossless = [q for q in target.format.quants.values() if q.lossless]
    if lossless:
        return max(lossless, key=lambda q: q.bits_per_weight)
    default = target.format.quant(target.format.default_quant)
    assert default is not None, f"{target.format.name} has no quant {target.format.default_quant}"
    return default


def _unavailable(message: str) -> None:
    if STRICT:
        pytest.fail(message + " (EDGEKIT_STRICT=1: set-up should have installed it)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("torch", "the tiny model is built with transformers")
    require("transformers", "the tiny model is built with transformers")
    from tests.tiny_models import build_tiny_model

    return build_tiny_model(FAMILY, tmp_path_factory.mktemp(f"contract-{FAMILY}"))


@pytest.fixture(scope="session", params=selected_targets(), ids=lambda t: t.name)
def target(request: pytest.FixtureRequest) -> type[Target]:
    chosen: type[Target] = request.param
    for module in chosen.sdk_modules:
        require(module, f"the {chosen.display_name} target loads it ({chosen.install_hint})")
    ok, detail = chosen.check_host()
    if not ok:  # installed, but this host cannot run it: not a set-up failure
        pytest.skip(f"{chosen.display_name} cannot run here: {detail}")
    return chosen


@pytest.fixture(scope="session")
def variant(
    target: type[Target], tiny_source: Path, tmp_path_factory: pytest.TempPathFactory
) -> Variant:
    from edgekit.converters.convert import convert_model

    quant = contract_quant(target)
    folder = tmp_path_factory.mktemp(f"contract-{target.name}") / f"{target.format.name}"
    path = folder / target.format.entry if target.format.entry else folder
    if target.format.entry:
        folder.mkdir()
    try:
        convert_model(tiny_source, target.format.name, path, quant=quant.name)
    except TargetUnavailableError as exc:
        _unavailable(f"cannot build a {target.format.name} variant here: {exc}")
    return Variant(target=target, source=tiny_source, path=path, quant=quant)


@pytest.fixture
def session(variant: Variant) -> Iterator[Any]:
    """A fresh session for each test: a test that fails with a stream open (its traceback
    keeps the stream) must not leave the next test a busy session."""
    s = variant.load()
    yield s
    s.close()
