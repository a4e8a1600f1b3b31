"""The layers, enforced: core <- formats <- targets <- services <- interfaces.

import-linter (grimp) finds a package by walking its folder, but edgekit's sub-packages
live in top-level folders mapped into ``edgekit.*`` by ``package-dir`` (the editable
install resolves them with an import hook grimp does not consult): walking ``edgekit/``
alone finds 58 modules and none of ``edgekit.converters`` or ``edgekit.targets``. The
tests therefore run ``lint-imports`` on the installed layout built as symlinks (the link
farm test_code_quality's mypy check uses), in a subprocess whose path starts there.

The contracts are in tests/importlinter.ini. Every import counts, function-local and
TYPE_CHECKING ones included: a local import that dodges a layer still depends on it.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import require
from tests.test_code_quality import LIBRARY, ROOT, _link_farm

CONFIG = Path(__file__).with_name("importlinter.ini")
CONTRACT = "importlinter:contract:layers"
SDKS = "importlinter:contract:core-sdks"
# Packages that only hold others (and the lazy public API, edgekit/__init__.py): they
# belong to no layer; a chain through them is still followed by the contract.
CONTAINERS = {"edgekit", "edgekit.converters"}


def _lint(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    require("importlinter", "the layer contracts are checked with import-linter")
    farm = _link_farm(tmp_path / "farm")
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            "--config",
            str(config),
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: edgekit must come from the farm
        env={**os.environ, "PYTHONPATH": str(farm)},
        timeout=300,
    )


def _layers(config: Path = CONFIG) -> list[list[str]]:
    """The modules of each layer, highest first."""
    parser = configparser.ConfigParser()
    parser.read(config)
    rows = parser[CONTRACT]["layers"].strip().splitlines()
    return [[m.strip().strip("()") for m in row.split(":")] for row in rows]


def _modules() -> list[str]:
    """Every module of the installed package, by name, from the source folders."""
    folders = {"edgekit": "edgekit", **{f"edgekit.{f}": f for f in LIBRARY[1:]}}
    found = []
    for package, folder in folders.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = f.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append(".".join((package, *parts)))
    return found


def _layer_of(module: str, layers: list[list[str]]) -> str | None:
    """The layer module that contains ``module`` (the longest match), if any."""
    matches = [m for row in layers for m in row if module == m or module.startswith(m + ".")]
    return max(matches, key=len) if matches else None


def test_layer_contracts_are_kept(tmp_path: Path) -> None:
    out = _lint(CONFIG, tmp_path)
    broken = out.stdout.partition("Broken contracts")[2]
    assert out.returncode == 0, (broken or out.stdout)[-20000:] + out.stderr[-5000:]
    assert "2 kept, 0 broken" in out.stdout


def test_the_sdk_contract_covers_the_core_layer() -> None:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    sources = parser[SDKS]["source_modules"].split()
    assert sorted(sources) == sorted(_layers()[-1])


def test_every_module_is_in_a_layer() -> None:
    """A new module must be placed in a layer (tests/importlinter.ini); otherwise the
    contract would check neither what it imports nor who imports it."""
    layers = _layers()
    unplaced = [m for m in _modules() if m not in CONTAINERS and _layer_of(m, layers) is None]
    assert not unplaced, "add these to a layer in tests/importlinter.ini:\n" + "\n".join(unplaced)


def test_every_layer_module_exists() -> None:
    """A layer that names a module that is gone checks nothing for it."""
    modules = set(_modules())
    missing = [m for row in _layers() for m in row if m not in modules]
    assert not missing, "tests/importlinter.ini names modules that do not exist: " + ", ".join(
        missing
    )


def test_the_contract_sees_imports(tmp_path: Path) -> None:
    """The farm is what grimp walks: with the core layer put on top of the targets (which
    import edgekit.errors), the contract must break, naming that import."""
    layers = _layers()
    inverted = tmp_path / "inverted.ini"
    rows = [["edgekit.errors"], ["edgekit.targets"]]
    inverted.write_text(
        "[importlinter]\nroot_package = edgekit\n\n"
        f"[{CONTRACT}]\nname = inverted\ntype = layers\nlayers =\n"
        + "".join(f"    {' : '.join(row)}\n" for row in rows)
    )
    assert ["edgekit.targets"] in layers  # the real config keeps them the right way up
    out = _lint(inverted, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "edgekit.targets" in out.stdout and "edgekit.errors" in out.stdout
    assert "1 broken" in out.stdout
