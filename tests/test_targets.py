"""Every registered target is in the catalogue, has a test module, and loads lazily."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgekit.targets.catalog import BY_NAME
from edgekit.targets.registry import get_target, registered_targets

from edgekit.errors import TargetError

TESTS = Path(__file__).parent


def test_registered_targets_are_catalogued() -> None:
    names = registered_targets()
    assert "llamacpp" in names
    for name in names:
        target = get_target(name)
        assert target.info is BY_NAME[name]


@pytest.mark.parametrize("name", registered_targets())
def test_every_registered_target_has_a_test_module(name: str) -> None:
    assert (TESTS / f"test_{name}_target.py").is_file(), f"target {name} has no tests"


def test_unknown_target_lists_the_installed_ones() -> None:
    with pytest.raises(TargetError) as info:
        get_target("cuda")
    assert "unknown target 'cuda'; installed: " in info.value.message
    assert "llamacpp" in info.value.message
