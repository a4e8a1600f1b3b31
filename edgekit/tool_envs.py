"""Isolated tool environments: a tool whose pins conflict with edgekit's own environment
(an exporter that needs another transformers) runs from a virtual environment of its own,
which edgekit creates, checks and drives.

A ``ToolEnv`` names the environment and its pinned requirements file (a format package
declares it: ``Format.tool_envs``). ``install`` creates ``<tools dir>/<name>`` with
``python -m venv`` and ``pip install -r``, and writes a stamp holding the sha256 of the
requirements last: an environment is ready only when its stamp matches the requirements
file, so a second install is instant, a changed pin reinstalls, and a failed or
interrupted install (which is removed) is never taken for a ready one. A virtual
environment cannot be moved (its scripts name their interpreter by absolute path), so it
is built in place, under a lock against a second installer. ``run`` runs one of its console
scripts in a subprocess, its output streamed to a log and to a callback line by line.

The tools dir is ``$EDGEKIT_TOOLS_DIR``, else ``<sys.prefix>/edgekit-tools``: inside the
virtual environment edgekit runs from, removed with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edgekit.errors import EdgekitError, ModelFormatError, TargetUnavailableError, WriteError
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safe_files import read_capped
from edgekit.untrusted import clean_text, parse_json

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; a second installer is not excluded
    fcntl = None  # type: ignore[assignment]

TOOLS_DIR_ENV = "EDGEKIT_TOOLS_DIR"
STAMP = "edgekit-tool-env.json"
STAMP_BYTES = 64 << 10
MAX_REQUIREMENTS = 1 << 20
TAIL_LINES = 40  # lines of a failed command kept for its error message
LINE_CHARS = 2000  # a longer output line is cut (a progress bar redrawn without newlines)
# variables of the calling environment that would make the tool's interpreter load
# edgekit's packages instead of its own
_LEAKY = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE")


@dataclass(frozen=True, kw_only=True)
class ToolEnv:
    """One isolated environment: its name (a folder name, and what ``edgekit tools
    install`` takes), its pinned requirements file, the console scripts it must provide,
    and extra pip arguments."""

    name: str
    requirements: Path
    scripts: tuple[str, ...]
    description: str
    pip_args: tuple[str, ...] = ()

    @property
    def install_hint(self) -> str:
        return f"edgekit tools install {self.name}"


@dataclass(frozen=True, kw_only=True)
class ToolEnvStatus:
    name: str
    path: Path
    ready: bool
    reason: str  # why not ready ("" when ready)
    requirements_sha256: str

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "ready": self.ready,
            "reason": self.reason,
            "requirements_sha256": self.requirements_sha256,
        }


def tools_dir() -> Path:
    """Where tool environments live: ``$EDGEKIT_TOOLS_DIR``, else inside the running
    virtual environment."""
    given = os.environ.get(TOOLS_DIR_ENV)
    # absolute: a venv's scripts name their interpreter by path, and a relative tools dir
    # would be another folder from another working directory
    return Path(given).expanduser().absolute() if given else Path(sys.prefix) / "edgekit-tools"


def env_path(env: ToolEnv) -> Path:
    return tools_dir() / env.name


def requirements_sha256(env: ToolEnv) -> str:
    """sha256 hex of the requirements file (what a ready environment's stamp holds).

    Raises:
        TargetUnavailableError: the file is missing or implausibly large (a broken
            installation of edgekit).
    """
    try:
        data = env.requirements.read_bytes()
    except OSError as exc:
        raise TargetUnavailableError(
            f"the requirements of tool environment {env.name} ({env.requirements}) cannot "
            f"be read: {exc.strerror}",
            hint="reinstall edgekit",
        ) from exc
    if len(data) > MAX_REQUIREMENTS:
        raise TargetUnavailableError(f"{env.requirements}: not a plausible requirements file")
    return hashlib.sha256(data).hexdigest()


def _bin(root: Path, name: str) -> Path:
    return root / ("Scripts" if os.name == "nt" else "bin") / name


def status(env: ToolEnv) -> ToolEnvStatus:
    """Whether ``env`` is installed and matches its requirements (never raises for a
    damaged environment: it is reported not ready, with why)."""
    root = env_path(env)
    digest = requirements_sha256(env)

    def result(reason: str) -> ToolEnvStatus:
        return ToolEnvStatus(
            name=env.name, path=root, ready=not reason, reason=reason, requirements_sha256=digest
        )

    if not root.is_dir():
        return result("not installed")
    try:
        data = read_capped(root / STAMP, max_bytes=STAMP_BYTES, error=ModelFormatError)
        stamp = parse_json(data, where=str(root / STAMP), max_bytes=STAMP_BYTES)
    except OSError:
        return result("not installed completely (no stamp): install it again")
    except EdgekitError as exc:  # a stamp that is not a small JSON file: not ready
        return result(f"its stamp is unreadable ({clean_text(exc, max_len=120)})")
    if not isinstance(stamp, dict) or stamp.get("requirements_sha256") != digest:
        return result("installed for other requirements: install it again to update it")
    missing = [s for s in ("python", *env.scripts) if not os.access(_bin(root, s), os.X_OK)]
    if missing:
        return result(f"{', '.join(missing)} missing from it: install it again")
    return result("")


def locate(env: ToolEnv) -> Path:
    """The root of ``env``, ready.

    Raises:
        TargetUnavailableError: it is not installed, or not for the current requirements
            (the hint is the install command).
    """
    found = status(env)
    if not found.ready:
        raise TargetUnavailableError(
            f"tool environment {env.name} at {found.path}: {found.reason}",
            hint=env.install_hint,
        )
    return found.path


def script(env: ToolEnv, name: str) -> Path:
    """The console script ``name`` of the ready ``env``.

    Raises:
        TargetUnavailableError: see ``locate``.
    """
    return _bin(locate(env), name)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive lock on ``root``'s lock file: a second installer waits."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        # never through a link planted at the lock's name
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(root.with_name(f"{root.name}.lock"), flags, 0o600)
    except OSError as exc:
        raise WriteError(f"cannot create {root.parent}: {exc.strerror}") from exc
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def install(
    env: ToolEnv, *, force: bool = False, progress: ProgressCallback = no_progress
) -> ToolEnvStatus:
    """Create ``env`` (instant when it is ready already, unless ``force``).

    Raises:
        TargetUnavailableError: venv or pip failed (the message quotes pip's last lines;
            the full log is beside the environment); nothing is left marked ready.
        WriteError: the tools dir cannot be written.
    """
    root = env_path(env)
    with _locked(root):
        before = status(env)
        if before.ready and not force:
            progress(ProgressEvent(stage="tools", done=1, total=1, detail="already installed"))
            return before
        log_path = root.with_name(f"{root.name}.install.log")
        if root.exists() or root.is_symlink():
            _check_ours(root)
            _remove(root)
        try:
            _build(env, root, log_path, progress)
        except BaseException:
            # interrupted or failed: an environment without its stamp is not ready, and
            # a half-installed one is removed rather than left to confuse the next run
            with contextlib.suppress(OSError):
                _remove(root)
            raise
        after = status(env)
        if not after.ready:
            _remove(root)
            raise TargetUnavailableError(
                f"tool environment {env.name} installed but is not usable: {after.reason}",
                hint=f"see {log_path}",
            )
        progress(ProgressEvent(stage="tools", done=3, total=3, detail="ready"))
        return after


def _check_ours(root: Path) -> None:
    """Refuse to replace a folder that is not a virtual environment: the tools dir is
    the user's choice ($EDGEKIT_TOOLS_DIR), and a folder there of the tool's name may be
    theirs. A link is replaced (only the link is removed)."""
    if root.is_symlink() or not root.is_dir():
        return
    if not (root / "pyvenv.cfg").is_file():
        raise TargetUnavailableError(
            f"{root} exists and is not a virtual environment: edgekit does not replace it",
            hint=f"move it away, or set {TOOLS_DIR_ENV} to another folder",
        )


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _build(env: ToolEnv, root: Path, log_path: Path, progress: ProgressCallback) -> None:
    digest = requirements_sha256(env)
    if log_path.is_symlink():  # written fresh, never through a link left at its name
        log_path.unlink()
    with log_path.open("w", encoding="utf-8") as log:
        progress(ProgressEvent(stage="tools", done=0, total=3, detail=f"creating {root}"))
        _step([sys.executable, "-m", "venv", str(root)], log, env, "python -m venv", progress)
        progress(ProgressEvent(stage="tools", done=1, total=3, detail="pip install"))
        pip = [
            str(_bin(root, "python")),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            *env.pip_args,
            "-r",
            str(env.requirements),
        ]
        _step(pip, log, env, "pip install", progress)
    stamp = {
        "name": env.name,
        "requirements_sha256": digest,
        "python": sys.version.split()[0],
        "requirements": env.requirements.read_text(encoding="utf-8"),
    }
    # written last, atomically: its presence is what "ready" means
    tmp = root / f"{STAMP}.tmp"
    tmp.write_text(json.dumps(stamp, indent=2), encoding="utf-8")
    os.replace(tmp, root / STAMP)
    progress(ProgressEvent(stage="tools", done=2, total=3, detail="installed"))


def _step(
    argv: Sequence[str], log: TextIO, env: ToolEnv, what: str, progress: ProgressCallback
) -> None:
    def on_line(text: str) -> None:
        # pip's "Collecting X" / "Installing collected packages" lines say where it is
        if text.startswith(("Collecting ", "Installing ", "Successfully ")):
            # "Collecting X (from Y->Z->...)": the chain that pulled it in is noise here
            short = text.partition(" (from ")[0]
            progress(ProgressEvent(stage="tools", done=1, total=3, detail=short[:100]))

    code, tail = run_streaming(argv, log=log, on_line=on_line)
    if code != 0:
        last = " | ".join(clean_text(t, max_len=200) for t in list(tail)[-3:])
        raise TargetUnavailableError(
            f"installing tool environment {env.name}: {what} failed (exit {code}): {last}",
            hint=f"the full output is in {log.name}",
        )


def clean_env(
    root: Path | None = None,
    extra: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (else the calling environment) without what would leak edgekit's
    packages into a tool's interpreter, plus ``extra``; ``root``'s bin folder first on
    PATH."""
    out = {k: v for k, v in (os.environ if base is None else base).items() if k not in _LEAKY}
    out.update(extra or {})
    if root is not None:
        out["PATH"] = os.pathsep.join([str(_bin(root, "")), out.get("PATH", "")])
        out["VIRTUAL_ENV"] = str(root)
    return out


# what a tool run by ``run_script`` inherits from the caller (its own variables are
# passed as ``extra_env``): enough to run, find home and temp, speak the locale and size
# its thread pools; not the caller's tokens, preloads or interpreter hooks
_TOOL_KEEP = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "TERM", "NO_COLOR", "SYSTEMROOT", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)  # fmt: skip


def minimal_env() -> dict[str, str]:
    """The caller's variables a tool needs to run (``_TOOL_KEEP`` and the LC_* ones)."""
    return {k: v for k, v in os.environ.items() if k in _TOOL_KEEP or k.startswith("LC_")}


def run_streaming(
    argv: Sequence[str],
    *,
    log: TextIO,
    on_line: Callable[[str], None],
    root: Path | None = None,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> tuple[int, deque[str]]:
    """Run ``argv``; every output line (stdout and stderr together) is written to the
    open text file ``log`` and passed to ``on_line``. Returns the exit code and the last
    lines. Ctrl-C stops the child before it propagates. The child's environment is
    ``base_env`` (else the caller's, see ``clean_env``) with ``extra_env``."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    env = clean_env(root, extra_env, base=base_env)
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    out = proc.stdout
    try:
        for raw in out if out is not None else ():
            text = raw.rstrip("\n")[:LINE_CHARS]
            log.write(text + "\n")
            tail.append(text)
            on_line(text)
        return proc.wait(), tail
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def run_script(
    env: ToolEnv,
    name: str,
    args: Sequence[str],
    *,
    log_path: Path,
    on_line: Callable[[str], None],
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[int, deque[str]]:
    """Run the console script ``name`` of the ready ``env`` with ``args`` in a minimal
    environment (``minimal_env``, ``extra_env`` added), its output to ``log_path`` and
    ``on_line``. Returns the exit code and the last lines.

    Raises:
        TargetUnavailableError: ``env`` is not ready (see ``locate``).
    """
    root = locate(env)
    with log_path.open("w", encoding="utf-8") as log:
        return run_streaming(
            [str(_bin(root, name)), *args],
            log=log,
            on_line=on_line,
            root=root,
            cwd=cwd,
            extra_env=extra_env,
            base_env=minimal_env(),
        )
