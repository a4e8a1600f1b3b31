"""Reading files under a folder without following links, and reading with a size bound.

A bundle, an extracted archive or a cache file comes from somewhere edgekit does not
control: a file in it may have been replaced by a symbolic link (to another model, to
/etc/passwd), a folder on its path by a link to elsewhere, a file by a FIFO that blocks
whoever opens it. ``open_regular`` opens ``root/rel`` one component at a time, each
folder with ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous one and the file with
``O_NOFOLLOW | O_NONBLOCK``, then checks it is a regular file; so the bytes read are
those of a regular file that really lies inside ``root``. ``root`` itself is the caller's
choice and may be reached through links.

On a platform without ``dir_fd`` support (Windows) each component is checked with
``lstat`` before the file is opened by path: the same refusals, without the guarantee
against a link swapped in between.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from edgekit.errors import EdgekitError

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
HAS_DIR_FD = {os.open, os.mkdir, os.stat, os.unlink} <= os.supports_dir_fd and bool(_O_NOFOLLOW)


class UnsafePathError(EdgekitError):
    """Internal: ``rel`` under ``root`` is missing, or not a regular file reached through
    real folders. Callers translate it into their own error (``reason`` says why)."""

    def __init__(self, rel: str, reason: str) -> None:
        super().__init__(f"{rel}: {reason}")
        self.rel = rel
        self.reason = reason


def kind_of(mode: int) -> str:
    """A file type in words, for messages."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def split_relative(rel: str) -> list[str]:
    """The components of a '/'-separated relative path; refuses what could leave a folder.

    Raises:
        UnsafePathError: absolute, empty, '.', '..' or empty components, a backslash or NUL.
    """
    if not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        raise UnsafePathError(rel, "not a plain relative path")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(rel, "not a plain relative path")
    return parts


def _diagnose(root: Path, parts: list[str]) -> str:
    """Why opening ``parts`` under ``root`` failed: the first component that is missing,
    a link, or not a folder."""
    here = root
    for i, part in enumerate(parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        last = i == len(parts) - 1
        where = "" if last else f" ({'/'.join(parts[: i + 1])})"
        if stat.S_ISLNK(mode):
            return (
                f"is a symbolic link{where}" if last else f"has a symbolic link on its path{where}"
            )
        if not last and not stat.S_ISDIR(mode):
            return f"has {kind_of(mode)} where a folder should be{where}"
        if last and not stat.S_ISREG(mode):
            return f"is {kind_of(mode)}, not a regular file"
    return "cannot be opened"


def open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``root/rel``, opened without following
    any link below ``root``. The caller closes it.

    Raises:
        UnsafePathError: see the module docstring; ``reason`` names the offending component.
    """
    parts = split_relative(rel)
    if not HAS_DIR_FD:
        return _open_regular_by_path(root, parts, rel)
    flags = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC | _O_BINARY
    fd = -1
    try:
        dir_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError as exc:
        raise UnsafePathError(rel, f"cannot be opened: {root} is not a folder") from exc
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, DIR_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        fd = os.open(parts[-1], flags, dir_fd=dir_fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePathError(rel, f"is {kind_of(mode)}, not a regular file")
        if _O_NONBLOCK:
            os.set_blocking(fd, True)
        return fd
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EMLINK):
            raise UnsafePathError(rel, _diagnose(root, parts)) from exc
        raise UnsafePathError(rel, f"cannot be read ({exc.strerror})") from exc
    except UnsafePathError:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        os.close(dir_fd)


def _open_regular_by_path(root: Path, parts: list[str], rel: str) -> int:
    reason = _diagnose(root, parts)
    if reason != "cannot be opened":
        raise UnsafePathError(rel, reason)
    try:
        return os.open(root.joinpath(*parts), os.O_RDONLY | _O_BINARY)
    except OSError as exc:
        raise UnsafePathError(rel, f"cannot be read ({exc.strerror})") from exc


def walk_no_follow(root: Path, rel: str) -> list[tuple[str, int]]:
    """Every entry below the folder ``root/rel`` as ('/'-relative-to-root path, lstat
    mode), links reported and never entered.

    Raises:
        UnsafePathError: ``rel`` is not a real folder inside ``root``.
    """
    parts = split_relative(rel)
    here = root
    for i, part in enumerate(parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except OSError as exc:
            raise UnsafePathError(rel, _diagnose(root, parts[: i + 1])) from exc
        if not stat.S_ISDIR(mode):
            raise UnsafePathError(rel, _diagnose(root, parts[: i + 1]))
    found: list[tuple[str, int]] = []
    pending = [rel]
    while pending:
        current = pending.pop()
        with os.scandir(root / current) as entries:
            for entry in entries:
                child = f"{current}/{entry.name}"
                mode = entry.stat(follow_symlinks=False).st_mode
                found.append((child, mode))
                if stat.S_ISDIR(mode):
                    pending.append(child)
    return sorted(found)


def read_capped(
    path: Path, *, max_bytes: int, error: type[EdgekitError], hint: str | None = None
) -> bytes:
    """The bytes of ``path``, refusing (before reading them all) more than ``max_bytes``.

    Raises:
        FileNotFoundError: ``path`` does not exist (the caller decides what that means).
        error: larger than ``max_bytes``, not a regular file, or unreadable.
    """
    fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | _O_BINARY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: {kind_of(mode)}, not a regular file", hint=hint)
        if _O_NONBLOCK:
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror})", hint=hint) from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path}: larger than the {max_bytes:,} bytes allowed", hint=hint)
    return data
