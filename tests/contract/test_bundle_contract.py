"""Every runnable target, through the user's path: the tiny model packed into a bundle for
the target, opened with ``edgekit.load`` (which passes the manifest's recorded runtime
settings) and generating. The session contract loads variants with ``Target.load``
directly, so a setting the manifest records but a target does not take was invisible
there (ONNX Runtime has no ``kv_cache`` setting: every packed ONNX bundle failed to load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from edgekit.targets.contract import Target

import edgekit
from edgekit.bundle import VariantRequest
from tests.contract.conftest import Variant


@pytest.fixture(scope="session")
def bundle(variant: Variant, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"bundle-{variant.target.name}") / "tiny-bundle"
    edgekit.pack(
        variant.source,
        out,
        [VariantRequest(target=variant.target.name, quant=variant.quant.name, context=256)],
    )
    return out


def _device(target: type[Target]) -> str:
    return "cpu" if "cpu" in target.devices_accepted else "auto"


def test_a_packed_bundle_loads_with_edgekit_load_and_generates(
    bundle: Path, variant: Variant
) -> None:
    direct = variant.load()
    try:
        expected = direct.generate("The capital of", max_tokens=6, temperature=0)
    finally:
        direct.close()
    with edgekit.load(bundle, device=_device(variant.target)) as session:
        info: Any = session.info
        assert info.target == variant.target.name
        # the same variant greedy: the bundle's recorded settings change nothing of it
        assert session.generate("The capital of", max_tokens=6, temperature=0) == expected
