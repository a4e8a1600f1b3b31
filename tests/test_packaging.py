"""The wheel holds every module of the mapped packages and every profile TOML."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# source folder -> where it lands in the wheel
MAPPING = {
    "edgekit": "edgekit",
    "converters": "edgekit/converters",
    "targets": "edgekit/targets",
    "profiles": "edgekit/profiles",
    "tui": "edgekit/tui",
}


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("edgekit-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def _sources(pattern: str) -> list[tuple[Path, str]]:
    found = []
    for folder, target in MAPPING.items():
        for f in (ROOT / folder).rglob(pattern):
            if "__pycache__" in f.parts:
                continue
            found.append((f, f"{target}/{f.relative_to(ROOT / folder).as_posix()}"))
    return found


def test_every_module_is_in_the_wheel(wheel_names: set[str]) -> None:
    missing = [dest for _, dest in _sources("*.py") if dest not in wheel_names]
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"


def test_every_profile_is_in_the_wheel(wheel_names: set[str]) -> None:
    profiles = [dest for src, dest in _sources("*.toml")]
    assert len(profiles) >= 12
    assert not [p for p in profiles if p not in wheel_names]


def test_typed_marker_and_entry_point(wheel_names: set[str]) -> None:
    assert "edgekit/py.typed" in wheel_names
    entry = next(n for n in wheel_names if n.endswith("entry_points.txt"))
    assert entry


def test_every_package_folder_is_declared() -> None:
    import tomllib

    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for folder, target in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            package = (target + "/" + init.parent.relative_to(ROOT / folder).as_posix()).rstrip(
                "/."
            )
            assert package.replace("/", ".") in declared, package
