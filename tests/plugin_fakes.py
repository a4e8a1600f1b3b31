"""Fake target plug-ins, installed the way a real plug-in distribution installs: one
module and one ``*.dist-info`` folder whose ``entry_points.txt`` registers the target in
the ``edgekit.targets`` group, in a folder a subprocess puts on its PYTHONPATH.

Nothing in edgekit is edited: the registry finds the fake through entry-point metadata,
exactly as it finds llama.cpp and OpenVINO.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from edgekit.plugins import TARGET_GROUP

ROOT = Path(__file__).resolve().parent.parent


def install_plugin(folder: Path, *, target: str, module: str, cls: str, source: str) -> Path:
    """Write ``module``.py (``source``) and a distribution registering ``module:cls`` as
    target ``target`` into ``folder``; returns ``folder`` (for PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    dist = folder / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        f"[{TARGET_GROUP}]\n{target} = {module}:{cls}\n", encoding="utf-8"
    )
    return folder


def plugin_env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that sees the plug-in in ``folder``."""
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_contract_suite(
    folder: Path, target: str, junit: Path, timeout: float = 900
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run tests/contract on ``target`` only, in a subprocess that sees the plug-in;
    returns the run and each test's outcome (passed, failed, error, skipped) by name."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "tests" / "contract"),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=plugin_env(folder, EDGEKIT_CONTRACT_TARGETS=target),
        timeout=timeout,
    )
    return run, junit_outcomes(junit) if junit.exists() else {}


def junit_outcomes(junit: Path) -> dict[str, str]:
    """test name (with its parameters) -> outcome, from a pytest JUnit XML report."""
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        outcomes[case.attrib["name"]] = outcome
    return outcomes
