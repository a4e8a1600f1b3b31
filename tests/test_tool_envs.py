"""Isolated tool environments (edgekit.tool_envs) and ``edgekit tools``.

The real environment (the Edge-LLM exporter, ~1.8 GB) is created by .ci/setup; here the
machinery runs on environments whose requirements install nothing heavy: an empty
requirements file, and one pip cannot satisfy offline (``--no-index``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgekit.converters.tensorrt.tool_env import EXPORT_ENV

import edgekit.tool_envs as tool_envs
from edgekit.cli import main
from edgekit.errors import TargetUnavailableError
from edgekit.tool_envs import (
    STAMP,
    TOOLS_DIR_ENV,
    ToolEnv,
    clean_env,
    env_path,
    install,
    locate,
    run_script,
    status,
    tools_dir,
)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "tools"))
    return tmp_path / "tools"


def _env(tmp_path: Path, text: str = "", name: str = "demo", **kw: object) -> ToolEnv:
    req = tmp_path / f"{name}-requirements.txt"
    req.write_text(text)
    return ToolEnv(name=name, requirements=req, scripts=("tool",), description="a demo", **kw)  # type: ignore[arg-type]


def _fake_ready(env: ToolEnv, script_body: str = "echo hello\necho bye\n") -> Path:
    """A tree that looks installed: bin/python, bin/tool, and a matching stamp."""
    root = env_path(env)
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    tool = root / "bin" / "tool"
    tool.write_text("#!/bin/sh\n" + script_body)
    tool.chmod(0o755)
    digest = hashlib.sha256(env.requirements.read_bytes()).hexdigest()
    (root / STAMP).write_text(json.dumps({"requirements_sha256": digest}))
    return root


def test_the_tools_dir_defaults_inside_the_running_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TOOLS_DIR_ENV, raising=False)
    assert tools_dir() == Path(sys.prefix) / "edgekit-tools"
    assert env_path(EXPORT_ENV) == Path(sys.prefix) / "edgekit-tools" / "tensorrt-export"
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path))
    assert env_path(EXPORT_ENV) == tmp_path / "tensorrt-export"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(TOOLS_DIR_ENV, "tools")  # the same folder from any working directory
    assert env_path(EXPORT_ENV) == Path.cwd() / "tools" / "tensorrt-export"


def test_status_says_why_an_environment_is_not_ready(tools: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert status(env).reason == "not installed"
    root = _fake_ready(env)
    assert status(env).ready and locate(env) == root
    (root / STAMP).write_text("{not json")
    assert "stamp is unreadable" in status(env).reason
    (root / STAMP).unlink()
    assert "no stamp" in status(env).reason
    (root / STAMP).symlink_to(tmp_path / "nowhere")
    assert not status(env).ready
    (root / STAMP).unlink()
    (root / STAMP).write_text(json.dumps({"requirements_sha256": "0" * 64}))
    assert status(env).reason.startswith("installed for other requirements")
    env.requirements.write_text("changed==1\n")
    (root / STAMP).write_text(
        json.dumps({"requirements_sha256": hashlib.sha256(b"changed==1\n").hexdigest()})
    )
    assert status(env).ready
    (root / "bin" / "tool").unlink()
    assert status(env).reason == "tool missing from it: install it again"
    with pytest.raises(TargetUnavailableError, match="tool missing") as e:
        locate(env)
    assert e.value.hint == "edgekit tools install demo"


def test_run_script_streams_lines_to_the_log_and_the_callback(tools: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    _fake_ready(env, 'echo "PYTHONPATH=${PYTHONPATH-unset}"\necho oops >&2\nexit 3\n')
    seen: list[str] = []
    os.environ["PYTHONPATH"] = "/leaky"
    try:
        code, tail = run_script(env, "tool", [], log_path=tmp_path / "log", on_line=seen.append)
    finally:
        del os.environ["PYTHONPATH"]
    assert code == 3 and seen == list(tail) == ["PYTHONPATH=unset", "oops"]
    assert (tmp_path / "log").read_text() == "PYTHONPATH=unset\noops\n"
    assert "PYTHONPATH" not in clean_env(tmp_path)
    assert clean_env(tmp_path)["PATH"].startswith(str(tmp_path / "bin"))


def test_a_tool_runs_with_a_minimal_environment(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter is given what it needs (PATH, HOME, locale, thread counts, the extra
    variables), not the caller's tokens, preloads or interpreter hooks."""
    env = _env(tmp_path)
    _fake_ready(env, "env\n")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setenv("PYTHONBREAKPOINT", "os.system")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    seen: list[str] = []
    code, _ = run_script(
        env, "tool", [], log_path=tmp_path / "log", on_line=seen.append, extra_env={"X": "1"}
    )
    names = {line.partition("=")[0] for line in seen}
    assert code == 0 and not names & {"HF_TOKEN", "LD_PRELOAD", "PYTHONBREAKPOINT"}
    assert {"PATH", "LC_ALL", "OMP_NUM_THREADS", "X", "VIRTUAL_ENV"} <= names


def test_a_missing_environment_is_refused_with_the_install_hint(tools: Path) -> None:
    with pytest.raises(TargetUnavailableError, match="not installed") as e:
        run_script(EXPORT_ENV, "tensorrt-edgellm-export", [], log_path=tools / "x", on_line=print)
    assert e.value.hint == "edgekit tools install tensorrt-export"


def test_an_interrupted_install_leaves_nothing(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)

    def half(env: ToolEnv, root: Path, log_path: Path, progress: object) -> None:
        (root / "bin").mkdir(parents=True)
        (root / STAMP).write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tool_envs, "_build", half)
    with pytest.raises(KeyboardInterrupt):
        install(env)
    assert not env_path(env).exists() and status(env).reason == "not installed"


def test_install_never_removes_a_folder_that_is_not_an_environment(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EDGEKIT_TOOLS_DIR pointed at a folder of the user's that holds a folder of the
    tool's name: install refuses rather than deleting it."""
    env = _env(tmp_path)
    mine = env_path(env)
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")

    def no_build(*_a: object, **_k: object) -> None:
        raise AssertionError("installed over the user's folder")

    monkeypatch.setattr(tool_envs, "_build", no_build)
    with pytest.raises(TargetUnavailableError, match="not a virtual environment") as e:
        install(env)
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert TOOLS_DIR_ENV in e.value.hint
    # a link there is removed, not what it points to
    (mine / "thesis.tex").rename(tmp_path / "thesis.tex")
    mine.rmdir()
    mine.symlink_to(tmp_path)
    monkeypatch.setattr(tool_envs, "_build", lambda *_a: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):
        install(env)
    assert not mine.is_symlink() and (tmp_path / "thesis.tex").exists()
    # nor is the install log written through a link left at its name
    monkeypatch.undo()
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tools))
    log = tools / "demo.install.log"
    log.symlink_to(tmp_path / "thesis.tex")
    monkeypatch.setattr(tool_envs, "run_streaming", lambda *_a, **_k: (1, ["no"]))
    with pytest.raises(TargetUnavailableError, match="python -m venv failed"):
        install(env)
    assert (tmp_path / "thesis.tex").read_text() == "years of work" and not log.is_symlink()


@pytest.mark.slow
def test_install_is_idempotent_and_follows_the_requirements(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ToolEnv(
        name="empty",
        requirements=tmp_path / "req.txt",
        scripts=("pip",),
        description="nothing",
        pip_args=("--no-index",),
    )
    env.requirements.write_text("")
    details: list[str] = []
    found = install(env, progress=lambda e: details.append(e.detail))
    assert found.ready and found.path == tools / "empty"
    assert details[0].startswith("creating") and details[-1] == "ready"
    stamp = json.loads((tools / "empty" / STAMP).read_text())
    assert stamp["requirements_sha256"] == hashlib.sha256(b"").hexdigest()

    def no_run(*_a: object, **_k: object) -> None:
        raise AssertionError("a ready environment was installed again")

    monkeypatch.setattr(tool_envs, "run_streaming", no_run)
    details.clear()
    assert install(env, progress=lambda e: details.append(e.detail)).ready
    assert details == ["already installed"]
    monkeypatch.undo()
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tools))
    # a changed pin is not ready; an install pip cannot satisfy leaves nothing behind
    env.requirements.write_text("edgekit-no-such-package==1.0\n")
    assert status(env).reason.startswith("installed for other requirements")
    with pytest.raises(TargetUnavailableError, match="pip install failed") as e:
        install(env)
    assert "edgekit-no-such-package" in e.value.message
    assert not (tools / "empty").exists() and status(env).reason == "not installed"
    assert "edgekit-no-such-package" in (tools / "empty.install.log").read_text()


def test_the_cli_lists_and_installs_what_the_formats_declare(tools: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["tools", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [r["name"] for r in rows] == ["tensorrt-export"]
    assert rows[0]["ready"] is False and rows[0]["reason"] == "not installed"
    assert rows[0]["path"] == str(tools / "tensorrt-export")
    bad = runner.invoke(main, ["tools", "install", "nope", "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.output[: bad.output.rindex("}") + 1])["hint"] == (
        "choose one of tensorrt-export"
    )
