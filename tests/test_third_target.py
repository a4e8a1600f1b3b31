"""A third target is one module and one registration.

The module below (``tinyfake``) is what a plug-in author writes: a Target with its own
name, compute units and prediction priors, holding the GGUF format and reusing the
llama.cpp runtime. The registration is a ``*.dist-info`` folder with ``entry_points.txt``,
what installing a plug-in distribution writes (tests/plugin_fakes.py). Nothing in edgekit
is edited; with that folder on PYTHONPATH the target appears in ``edgekit probe``, in
``edgekit plan``'s candidates, is packed by ``edgekit pack``, loaded by ``edgekit.load``,
measured by ``edgekit bench``, and passes the whole contract suite (tests/contract/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.plugin_fakes import ROOT, install_plugin, plugin_env, run_contract_suite

NAME = "tinyfake"
TINYFAKE = '''
    """tinyfake: llama.cpp's runtime as a target of its own, with its own units and priors."""

    from __future__ import annotations

    import dataclasses
    from pathlib import Path
    from typing import Any, ClassVar

    from edgekit.converters.formats import Format
    from edgekit.converters.gguf import FORMAT
    from edgekit.targets.contract import Coefficients, UnitSupport
    from edgekit.targets.llamacpp import LlamaCppTarget


    class TinyFakeTarget(LlamaCppTarget):
        name: ClassVar[str] = "tinyfake"
        display_name: ClassVar[str] = "Tiny fake (llama.cpp inside)"
        devices: ClassVar[str] = "any CPU, slowly"
        format: ClassVar[Format] = FORMAT
        priority: ClassVar[int] = 1000  # never the default target
        units: ClassVar[tuple[UnitSupport, ...]] = (
            UnitSupport(
                kind="cpu",
                formats=("Q8_0", "F16"),
                priors=Coefficients(
                    bandwidth_efficiency=0.25,
                    token_overhead_s=0.002,
                    compute_efficiency=0.1,
                    runtime_bytes=64 << 20,
                    weight_residency=1.0,
                    kv_preallocated=True,
                ),
            ),
        )

        @classmethod
        def accelerators(cls, profile):
            return [a for a in profile.accelerators if a.kind == "cpu"]

        @classmethod
        def load(cls, model: str | Path, **settings: Any):
            session = super().load(model, **settings)
            session.info = dataclasses.replace(session.info, target=cls.name)
            return session
'''


def _edgekit(plugin: Path, *args: str, timeout: float = 600) -> Any:
    """Run ``edgekit ARGS --json`` seeing the plug-in; its JSON output."""
    out = subprocess.run(
        [sys.executable, "-m", "edgekit", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=plugin.parent,
        env=plugin_env(plugin),
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return json.loads(out.stdout)


def _names(found: Any) -> set[str]:
    """Every value of a ``target``/``name`` key anywhere in a JSON document."""
    names: set[str] = set()
    if isinstance(found, dict):
        for key, value in found.items():
            if key in ("target", "name") and isinstance(value, str):
                names.add(value)
            names |= _names(value)
    elif isinstance(found, list):
        for value in found:
            names |= _names(value)
    return names


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("llama_cpp", "tinyfake runs llama.cpp")
    return install_plugin(
        tmp_path_factory.mktemp("tinyfake") / "site",
        target=NAME,
        module="edgekit_tinyfake",
        cls="TinyFakeTarget",
        source=TINYFAKE,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("torch", "the tiny model is built with transformers")
    from tests.tiny_models import build_tiny_model

    return build_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.slow
def test_a_third_target_is_one_module_and_one_registration(
    plugin: Path, tiny: Path, tmp_path: Path
) -> None:
    probed = _edgekit(plugin, "probe")
    assert NAME in _names(probed["targets"]), probed["targets"]

    planned = _edgekit(plugin, "plan", str(tiny), "--device", "host", "--all")
    targets = {c["target"] for c in planned["candidates"]}
    assert NAME in targets, targets

    bundle = tmp_path / "tiny.bundle"
    packed = _edgekit(
        plugin, "pack", str(tiny), "--target", NAME, "--quant", "Q8_0", "-o", str(bundle)
    )
    assert len(packed["variants"]) == 1, packed

    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, edgekit\n"
            "with edgekit.load(sys.argv[1]) as s:\n"
            "    g = s.generate('It is a truth', max_tokens=4, temperature=0, ignore_eos=True)\n"
            "    print(json.dumps({'target': s.info.target, 'variant': s.variant.target,\n"
            "                      'tokens': g.completion_tokens}))\n",
            str(bundle),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=plugin_env(plugin),
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    assert json.loads(loaded.stdout) == {"target": NAME, "variant": NAME, "tokens": 4}

    benched = _edgekit(
        plugin, "bench", str(bundle), "--prompt-lengths", "16", "--gen-tokens", "8",
        "--repeats", "1", "--warmup", "0",
    )  # fmt: skip
    assert NAME in _names(benched), benched

    run, outcomes = run_contract_suite(plugin, NAME, tmp_path / "junit.xml")
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert outcomes and set(outcomes.values()) == {"passed"}, outcomes
    assert all(NAME in name for name in outcomes)


def test_the_repository_is_not_touched() -> None:
    """The fake lives in a temporary folder: no edgekit module names it."""
    hits = [
        str(p.relative_to(ROOT))
        for folder in ("edgekit", "converters", "targets", "tui")
        for p in (ROOT / folder).rglob("*.py")
        if NAME in p.read_text(encoding="utf-8")
    ]
    assert not hits
