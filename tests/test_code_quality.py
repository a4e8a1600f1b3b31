"""House rules, checked: lint, strict types, and no print/assert/exit in library code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("edgekit", "targets", "converters", "profiles", "tui")
# The CLI and the TUI are where output and exit codes belong.
ALLOWED = ("edgekit/cli/", "edgekit/__main__.py", "tui/")
FORBIDDEN = re.compile(r"^\s*(print\(|assert\s|sys\.exit\(|exit\()")


def test_no_print_assert_or_exit_in_library_code() -> None:
    hits = []
    for folder in LIBRARY:
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if FORBIDDEN.match(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, hits


def test_ruff() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _link_farm(dest: Path) -> Path:
    """The installed package layout as symlinks (what a strict editable install builds),
    so mypy sees edgekit.converters, edgekit.targets, ... as they are imported."""
    package = dest / "edgekit"
    package.mkdir(parents=True)
    for entry in (ROOT / "edgekit").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in LIBRARY[1:]:
        (package / folder).symlink_to(ROOT / folder)
    return dest


def test_mypy_strict(tmp_path: Path) -> None:
    farm = _link_farm(tmp_path / "farm")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "-p", "edgekit"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "MYPYPATH": str(farm)},
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
