"""Bundle archives: one uncompressed .tar of the bundle folder, read by edgekit's own reader.

A bundle needs regular files and folders, nothing else, so that is all this reader
accepts; it does not rely on tarfile's extraction (nor its ``data`` filter, which a chain
of symbolic links through long names gets past: CVE-2025-4517). Two passes:

1. **Headers** (nothing is written, ``edgekit.archive_headers``): every member is read
   and checked before any byte is extracted; links, devices, odd names, limits, corrupt
   or truncated archives are refused there. Then the free space is checked.
2. **Extraction** (here): every folder is opened relative to its parent with
   ``O_DIRECTORY | O_NOFOLLOW`` and every file created with ``O_CREAT | O_EXCL |
   O_NOFOLLOW``, so no link, planted or raced in, is ever followed and nothing is
   overwritten. Modes are not taken from the archive (files 0644, folders 0755). Then
   each file is looked up again from the root, component by component with ``lstat``,
   and must be the very inode written (one link, a regular file, inside the root).

Any failure removes everything extracted; the error names the member and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from edgekit.archive_headers import Member, read_members, refuse
from edgekit.errors import BundleError, BundleIntegrityError
from edgekit.safe_files import DIR_FLAGS, HAS_DIR_FD, kind_of
from edgekit.untrusted import clean_text

_COPY_CHUNK = 1 << 20
_OPEN_DIRS = 64  # folder descriptors kept open while extracting


# --- writing ---------------------------------------------------------------------------------


def write_archive(folder: Path, archive: Path) -> None:
    """Write ``folder`` as an uncompressed tar whose members sit under the folder's name:
    folders and regular files only, with normalized owners and modes.

    Raises:
        BundleError: the folder holds something other than files and folders.
    """
    with (
        open(archive, "xb") as out,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in [folder, *sorted(folder.rglob("*"))]:
            st = path.lstat()
            rel = (
                folder.name
                if path == folder
                else f"{folder.name}/{path.relative_to(folder).as_posix()}"
            )
            info = tarfile.TarInfo(rel)
            info.mtime = int(st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size, info.mode = st.st_size, 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                raise BundleError(f"{path} is {kind_of(st.st_mode)}: a bundle holds files only")


# --- extraction ------------------------------------------------------------------------------


def extract_archive(
    archive: Path,
    dest: Path,
    *,
    max_total: int | None = None,
    max_members: int | None = None,
) -> Path:
    """Extract a bundle archive into ``dest`` (created here; it must not exist); returns
    the bundle folder inside it. On any failure ``dest`` is removed.

    Raises:
        BundleNotFoundError: not a tar file, or an empty one.
        UnsafeArchiveError: a member or a limit refused (see the module docstring).
        BundleIntegrityError: a corrupt or truncated archive.
        BundleError: not enough free space, or the extraction failed (the reason given).
    """
    with open(archive, "rb") as f:
        members = read_members(f, archive, max_total=max_total, max_members=max_members)
        top = members[0].name.split("/", 1)[0]
        needed = sum(m.size for m in members)
        _check_space(archive, dest, needed)
        try:
            os.mkdir(dest, 0o755)
        except OSError as exc:
            raise BundleError(f"cannot extract {archive} into {dest}: {exc.strerror}") from exc
        try:
            written = _write_members(f, members, dest)
            _check_landing(dest, written)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    return dest / top


def _check_space(archive: Path, dest: Path, needed: int) -> None:
    free = shutil.disk_usage(dest.parent).free
    if needed > free:
        raise BundleError(
            f"extracting {archive} needs {needed:,} bytes; only {free:,} are free on {dest.parent}",
            hint="free some space, or set EDGEKIT_CACHE to a folder on a larger disk",
        )


class _Folders:
    """Descriptors of the folders being extracted into, each opened from its parent
    without following links (a bounded number stay open)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root_fd = os.open(root, DIR_FLAGS)
        self.open: dict[str, int] = {}

    def fd(self, parts: list[str]) -> int:
        if not parts:
            return self.root_fd
        key = "/".join(parts)
        if key in self.open:
            return self.open[key]
        if len(self.open) >= _OPEN_DIRS:
            self.close_children()
        parent = self.fd(parts[:-1])
        with contextlib.suppress(FileExistsError):  # made by an earlier member
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
        fd = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
        self.open[key] = fd
        return fd

    def close_children(self) -> None:
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()

    def close(self) -> None:
        self.close_children()
        os.close(self.root_fd)


def _write_members(f: BinaryIO, members: list[Member], dest: Path) -> list[tuple[str, int, int]]:
    """Create every folder and file; returns (name, device, inode) of each file."""
    if not HAS_DIR_FD:
        return _write_members_by_path(f, members, dest)
    written: list[tuple[str, int, int]] = []
    folders = _Folders(dest)
    try:
        for m in members:
            parts = m.name.split("/")
            try:
                if m.kind == "dir":
                    folders.fd(parts)
                    continue
                parent = folders.fd(parts[:-1])
                fd = os.open(parts[-1], _NEW_FILE, 0o644, dir_fd=parent)
            except OSError as exc:
                raise _write_error(m.name, exc) from exc
            written.append(_fill(f, m, fd))
    finally:
        folders.close()
    return written


_NEW_FILE = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _write_members_by_path(
    f: BinaryIO, members: list[Member], dest: Path
) -> list[tuple[str, int, int]]:
    written: list[tuple[str, int, int]] = []
    for m in members:
        target = dest.joinpath(*m.name.split("/"))
        try:
            if m.kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, _NEW_FILE, 0o644)
        except OSError as exc:
            raise _write_error(m.name, exc) from exc
        written.append(_fill(f, m, fd))
    return written


def _fill(f: BinaryIO, member: Member, fd: int) -> tuple[str, int, int]:
    """Copy ``member``'s bytes into the new file ``fd`` and close it; returns (name,
    device, inode), by which the file is found again after extraction."""
    try:
        _copy(f, member, fd)
        st = os.fstat(fd)
    except OSError as exc:
        raise _write_error(member.name, exc) from exc
    finally:
        os.close(fd)
    return member.name, st.st_dev, st.st_ino


def _write_error(name: str, exc: OSError) -> BundleError:
    if exc.errno == errno.EEXIST:
        return refuse(name, "appears twice (this file system sees two members as one name)")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return refuse(name, "has a link or a file in the way of its folder")
    if exc.errno == errno.ENAMETOOLONG:
        return refuse(name, "has a name too long for this file system")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return BundleError(f"no space left while extracting {clean_text(name)!r}")
    return BundleError(f"cannot extract {clean_text(name)!r}: {exc.strerror}")


def _copy(f: BinaryIO, member: Member, fd: int) -> None:
    f.seek(member.offset)
    remaining = member.size
    while remaining:
        chunk = f.read(min(_COPY_CHUNK, remaining))
        if not chunk:
            raise BundleIntegrityError(
                f"the archive is truncated inside {clean_text(member.name)!r}"
            )
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
        remaining -= len(chunk)


def _check_landing(dest: Path, written: list[tuple[str, int, int]]) -> None:
    """Look every written file up again from ``dest``: real folders all the way, and the
    very file written (same inode, one link), inside ``dest``."""
    root = os.path.realpath(dest)
    for name, dev, ino in written:
        try:
            path = dest
            for part in name.split("/")[:-1]:
                path = path / part
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise refuse(name, "did not land where it was written (a folder changed)")
            st = os.lstat(dest / name)
            real = os.path.realpath(dest / name)
        except OSError as exc:
            raise refuse(name, "did not land where it was written") from exc
        if (
            not stat.S_ISREG(st.st_mode)
            or (st.st_dev, st.st_ino) != (dev, ino)
            or st.st_nlink != 1
            or os.path.commonpath([root, real]) != root
        ):
            raise refuse(name, "did not land where it was written")


def list_members(archive: Path) -> list[Member]:
    """The members of a bundle archive, checked as ``extract_archive`` checks them
    (nothing is extracted).

    Raises:
        BundleNotFoundError, UnsafeArchiveError, BundleIntegrityError: as extract_archive.
    """
    with open(archive, "rb") as f:
        return read_members(f, archive)
