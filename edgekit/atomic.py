"""Every file and folder edgekit writes, written one way: beside the destination, then
renamed into place; never through a link; nothing partial left behind.

- ``write_atomic(dest, data)``: a small file (a manifest, a cache, a result). The
  temporary sibling is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``: a link
  planted at its name is refused, never followed), written, fsynced and renamed over
  ``dest`` (a rename replaces a link at ``dest``; it never writes through it).
- ``atomic_path(dest)``: a large output (a converted model, a bundle). The caller writes
  a file or folder at the yielded path, which lies inside a private folder created
  exclusively beside ``dest`` (mode 0700: nobody can plant anything in it); on success it
  is fsynced and renamed to ``dest``.
- ``work_dir(dest, kind)``: a private scratch folder beside ``dest`` (pack's build folder,
  a quantizer's intermediate file), removed on the way out.
- ``open_new(path)`` / ``write_new(path, data)``: a new file inside such a folder,
  created exclusively.

Hidden siblings are named ``.NAME.KIND-PID-HOST-RANDOM``. Every failure removes them,
KeyboardInterrupt included; ``interrupt_on_termination`` makes SIGTERM (and SIGHUP) a
KeyboardInterrupt so a terminated run cleans up as Ctrl-C does. A run killed outright
(SIGKILL, power loss) cannot clean up: the next write beside the same destination
removes siblings whose process is gone (``clean_stale_siblings``), and never one whose
process still runs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from edgekit.errors import OutputExistsError, WriteError
from edgekit.safe_files import HAS_DIR_FD
from edgekit.untrusted import clean_text

log = logging.getLogger(__name__)

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY
_KINDS = ("partial", "build", "tmp")
_SIBLING = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>partial|build|tmp)-(?P<pid>\d+)-(?P<host>[0-9a-f]{6})-[0-9a-f]{8}$"
)
# Errors inside a writer's block that can only mean "the destination cannot take it"
# (a permission error there may as well be about reading the source).
_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}


def check_destination(dest: Path, *, force: bool) -> None:
    """Fail early, before any work, when ``dest`` exists and ``force`` is not set.

    Raises:
        OutputExistsError: the destination exists (a dangling link counts).
        WriteError: the path holds a NUL byte (no file system takes one; ``lexists``
            would only say False, and the first write raise a bare ValueError).
    """
    if "\0" in os.fspath(dest):
        raise WriteError(
            f"{clean_text(os.fspath(dest))!r}: an output path cannot contain a NUL byte",
            hint="choose another output path",
        )
    if os.path.lexists(dest) and not force:
        raise OutputExistsError(
            f"{dest} already exists", hint="pass --force (force=True) to replace it"
        )


def check_apart(src: Path, dest: Path) -> None:
    """Fail early when writing ``dest`` would destroy ``src``, the model it is made from:
    ``dest`` is ``src``, holds it (a folder above it: replacing it with --force removes
    the source with it), or lies inside it (the source changes under the conversion).
    Paths are compared resolved, so a link or ``..`` does not hide it.

    Raises:
        WriteError: the two overlap.
    """
    s, d = Path(os.path.realpath(src)), Path(os.path.realpath(dest))
    if s == d or d in s.parents or s in d.parents:
        where = "is" if s == d else "holds" if d in s.parents else "is inside"
        raise WriteError(
            f"the output {dest} {where} the model it is made from ({src}): writing it "
            "would destroy the source",
            hint="write the output somewhere outside the source model",
        )


# --- hidden siblings: names, owners, stale ones ------------------------------------------


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def sibling_name(dest_name: str, kind: str) -> str:
    """``.NAME.KIND-PID-HOST-RANDOM``: whose it is (this process on this host), in the name."""
    if kind not in _KINDS:
        raise ValueError(f"unknown sibling kind {kind!r}")
    return f".{dest_name}.{kind}-{os.getpid()}-{_host_tag()}-{secrets.token_hex(4)}"


def _owner_gone(pid: int, host: str) -> bool:
    """True only when the owner surely no longer runs: same host, and no such process.
    A reused pid keeps a stale sibling a while longer; that is the safe mistake."""
    if host != _host_tag() or pid == os.getpid():
        return False
    import psutil  # pid_exists is safe on every platform (os.kill(pid, 0) is not on Windows)

    return not psutil.pid_exists(pid)


def clean_stale_siblings(dest: Path) -> list[Path]:
    """Remove the hidden siblings of ``dest`` left by edgekit runs that no longer exist
    (killed with SIGKILL, power lost). Best effort: what cannot be removed stays.
    Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(dest.parent))
    except OSError:
        return removed
    uid = getattr(os, "getuid", lambda: None)()
    for entry in entries:
        match = _SIBLING.match(entry.name)
        if not match or match["name"] != dest.name:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if uid is not None and info.st_uid != uid:
            continue  # another user's: not ours to judge
        if not _owner_gone(int(match["pid"]), match["host"]):
            continue
        try:
            _remove(Path(entry.path))
            removed.append(Path(entry.path))
        except OSError as exc:
            log.debug("could not remove stale %s: %s", entry.path, exc)
    if removed:
        log.info("removed %d stale hidden folder(s) beside %s", len(removed), dest)
    return removed


def _remove(path: Path) -> None:
    """Remove a file, link or folder; a link is removed itself, never followed."""
    mode = os.lstat(path).st_mode
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)  # uses fd-based, link-safe removal where the platform has it
    else:
        path.unlink()


@contextlib.contextmanager
def work_dir(dest: str | Path, kind: str = "build") -> Iterator[Path]:
    """A private folder (mode 0700) beside ``dest``, created exclusively, removed when the
    block ends however it ends. Stale siblings of ``dest`` are removed first.

    Raises:
        WriteError: the folder cannot be created (no permission, read-only, no space).
    """
    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot create {dest.parent}: {exc.strerror}") from exc
    clean_stale_siblings(dest)
    box = _make_private_dir(dest, kind)
    try:
        yield box
    finally:
        with contextlib.suppress(FileNotFoundError):
            _remove(box)


def _make_private_dir(dest: Path, kind: str) -> Path:
    for _ in range(16):
        box = dest.parent / sibling_name(dest.name, kind)
        try:
            os.mkdir(box, 0o700)  # exclusive: fails on anything already there, link included
            return box
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteError(f"cannot write beside {dest}: {exc.strerror}") from exc
    raise WriteError(f"cannot create a private folder beside {dest}")


# --- large outputs ---------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(dest: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a path (not yet existing) in a private folder beside ``dest``; the caller
    writes a file or a folder there. On success it is fsynced and renamed to ``dest``
    (the previous ``dest``, if ``force``, is moved aside first and removed after); on any
    failure nothing is left and ``dest`` is untouched.

    Raises:
        OutputExistsError: ``dest`` exists and ``force`` is not set.
        WriteError: no space, read-only or no permission at the destination.
    """
    dest = Path(dest)
    check_destination(dest, force=force)
    with work_dir(dest, "partial") as box:
        tmp = box / dest.name
        try:
            yield tmp
        except OSError as exc:
            if exc.errno in _DISK_ERRNOS:
                raise WriteError(f"cannot write {dest}: {exc.strerror}") from exc
            raise
        if not os.path.lexists(tmp):
            return  # the caller decided not to write anything
        _install(tmp, dest, box, force=force)


def _inside_private_folder(path: Path) -> bool:
    """Inside another run's hidden folder (a bundle being packed, a scratch folder): the
    output is flushed when that folder is installed, or never outlives the run."""
    return any(_SIBLING.match(parent.name) for parent in path.parents)


def _install(tmp: Path, dest: Path, box: Path, *, force: bool) -> None:
    try:
        if not _inside_private_folder(dest):
            _fsync_tree(tmp)
        previous = box / ".previous"
        if os.path.lexists(dest):
            if not force:  # appeared while we worked
                raise OutputExistsError(
                    f"{dest} already exists", hint="pass --force (force=True) to replace it"
                )
            os.rename(dest, previous)  # moves a link itself; never follows it
        try:
            os.rename(tmp, dest)
        except OSError:
            if os.path.lexists(previous):
                os.rename(previous, dest)
            raise
        _fsync_dir(dest.parent)
    except OSError as exc:
        raise WriteError(f"cannot write {dest}: {exc.strerror}") from exc


def _fsync_tree(path: Path) -> None:
    """Flush a written file, or every file of a written folder, to the disk: a rename
    after a power loss must not point at empty files."""
    if path.is_symlink():
        return
    if path.is_dir():
        for child in path.rglob("*"):
            if child.is_file() and not child.is_symlink():
                _fsync_file(child)
        _fsync_dir(path)
    elif path.is_file():
        _fsync_file(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name == "nt":
        return  # folders cannot be opened for fsync there
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename is still atomic
    finally:
        os.close(fd)


# --- small files -----------------------------------------------------------------------------


def write_atomic(dest: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``dest`` atomically; returns ``dest``.

    Readers see the old file or the new one, never half of one; a link at ``dest`` is
    replaced, not written through; a link planted at the temporary name is refused.

    Raises:
        WriteError: the parent cannot be created or written, or ``dest`` is a folder.
    """
    dest = Path(dest)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot create {dest.parent}: {exc.strerror}") from exc
    clean_stale_siblings(dest)
    if HAS_DIR_FD:
        _write_atomic_at(dest, payload)
    else:
        _write_atomic_by_path(dest, payload)
    return dest


def _write_atomic_at(dest: Path, payload: bytes) -> None:
    # The parent is the caller's choice (it may be reached through a link, e.g. a cache
    # folder moved to another disk); the names inside it are never followed.
    dir_fd = os.open(dest.parent, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    tmp = ""
    try:
        tmp, fd = _create_exclusive(dest, dir_fd)
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = ""
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    except OSError as exc:
        raise WriteError(f"cannot write {dest}: {exc.strerror}") from exc
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)


def _create_exclusive(dest: Path, dir_fd: int) -> tuple[str, int]:
    for _ in range(16):
        name = sibling_name(dest.name, "tmp")
        try:
            return name, os.open(name, _NEW_FILE, 0o644, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise WriteError(f"cannot create a temporary file beside {dest}")


def _write_atomic_by_path(dest: Path, payload: bytes) -> None:
    tmp: Path | None = None
    try:
        for _ in range(16):
            candidate = dest.with_name(sibling_name(dest.name, "tmp"))
            try:
                fd = os.open(candidate, _NEW_FILE, 0o644)
            except FileExistsError:
                continue
            tmp = candidate
            break
        else:
            raise WriteError(f"cannot create a temporary file beside {dest}")
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
        tmp = None
    except OSError as exc:
        raise WriteError(f"cannot write {dest}: {exc.strerror}") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def open_new(path: str | Path) -> BinaryIO:
    """A new file at ``path``, created exclusively and never through a link, open for
    binary writing. For files inside a ``work_dir`` or ``atomic_path`` folder.

    Raises:
        OutputExistsError: something (a file, a link, a folder) is already at ``path``.
        WriteError: it cannot be created.
    """
    try:
        fd = os.open(path, _NEW_FILE, 0o644)
    except FileExistsError as exc:
        raise OutputExistsError(f"{path} already exists; edgekit writes only new files") from exc
    except OSError as exc:
        raise WriteError(f"cannot create {path}: {exc.strerror}") from exc
    return os.fdopen(fd, "wb")


def write_new(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8) to a new file at ``path`` (see ``open_new``)."""
    with open_new(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


# --- signals ---------------------------------------------------------------------------------

_TERMINATION_SIGNALS = ("SIGTERM", "SIGHUP")


def interrupt_on_termination() -> bool:
    """Make SIGTERM (and SIGHUP, a closed terminal) raise KeyboardInterrupt in the main
    thread, as Ctrl-C does, so every ``finally`` runs and no hidden folder is left.

    A signal whose handler is not the default (an application installed its own, or
    ``nohup`` ignores SIGHUP) is left alone. The first signal restores the default, so a
    second one terminates at once if the clean-up itself hangs. Call it from the main
    thread (the CLI's entry point); elsewhere it does nothing. Returns whether any
    handler was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    installed = False
    for name in _TERMINATION_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None or signal.getsignal(signum) is not signal.SIG_DFL:
            continue
        signal.signal(signum, _raise_interrupt)
        installed = True
    return installed


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)
    raise KeyboardInterrupt(f"terminated by {signal.Signals(signum).name}")
