"""The edgekit CLI: version, help, JSON output and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from edgekit import __version__
from edgekit.cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=120
    )


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for verb in ("inspect", "probe", "profiles"):
        assert verb in result.output


def test_error_is_one_screen_without_traceback(tmp_path: Path) -> None:
    result = run("inspect", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert "error:" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.splitlines()) <= 8


def test_error_as_json(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" * 10)
    result = run("inspect", str(bad), "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["error"] == "ModelFormatError" and "magic" in data["message"] and data["hint"]


def test_verbose_shows_the_traceback(tmp_path: Path) -> None:
    result = run("-v", "inspect", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_inspect_default_model_json(default_gguf: Path) -> None:
    result = run("inspect", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["path"] == str(default_gguf)
    assert data["parameters"] == 134_515_008
    assert len(data["tensors"]) == 272


def test_inspect_table(default_gguf: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(default_gguf), "--tensors"])
    assert result.exit_code == 0
    assert "134,515,008" in result.output and "blk.0.attn_q.weight" in result.output


def test_profiles_list_and_show() -> None:
    result = CliRunner().invoke(main, ["profiles", "--json"])
    assert result.exit_code == 0
    names = [p["name"] for p in json.loads(result.output)]
    assert len(names) >= 12
    shown = CliRunner().invoke(main, ["profiles", "show", names[0], "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["name"] == names[0]
    table = CliRunner().invoke(main, ["profiles"])
    assert table.exit_code == 0 and names[0] in table.output


def test_unknown_profile() -> None:
    result = run("profiles", "show", "jetson")
    assert result.returncode == 1
    assert "no device profile named 'jetson'" in result.stderr
    assert "jetson-" in result.stderr  # suggests the close names


def test_probe_table() -> None:
    result = CliRunner().invoke(main, ["probe"])
    assert result.exit_code == 0, result.output
    assert "Power sensors" in result.output and "Targets" in result.output
