"""Bundle archives: one uncompressed .tar of the bundle folder, and safe extraction.

Extraction refuses, before writing anything: absolute member paths, ``..`` components,
links (symbolic or hard) that point outside the bundle, device files and FIFOs, and
archives whose members add up to more than a size cap or a member-count cap. Python's
own ``data`` filter is applied as well, as a second line of defence.
"""

from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path

from edgekit.errors import BundleNotFoundError, UnsafeArchiveError

MAX_TOTAL_BYTES = 256 << 30  # a bundle of a 70B model at 8 bits fits; a tar bomb does not
MAX_MEMBERS = 10_000


def write_archive(folder: Path, archive: Path) -> None:
    """Write ``folder`` as an uncompressed tar whose members sit under the folder's name."""
    with tarfile.open(archive, "w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(
                path,
                arcname=f"{folder.name}/{path.relative_to(folder).as_posix()}",
                recursive=False,
            )


def check_members(tar: tarfile.TarFile, *, max_total: int = MAX_TOTAL_BYTES) -> str:
    """Validate every member; returns the single top-level folder name.

    Raises:
        UnsafeArchiveError: the first offending member, named, with the reason.
    """
    members = tar.getmembers()
    if len(members) > MAX_MEMBERS:
        raise UnsafeArchiveError(f"the archive has {len(members)} members (limit {MAX_MEMBERS})")
    total = 0
    tops: set[str] = set()
    for m in members:
        name = m.name
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise UnsafeArchiveError(f"archive member {name!r} has an absolute path")
        parts = posixpath.normpath(name).split("/")
        if ".." in name.split("/") or parts[0] == "..":
            raise UnsafeArchiveError(f"archive member {name!r} leaves the bundle folder")
        if m.isdev() or m.isfifo() or m.ischr() or m.isblk():
            raise UnsafeArchiveError(f"archive member {name!r} is a device or FIFO")
        if m.issym() or m.islnk():
            # Symbolic links resolve from their own folder, hard links from the archive root.
            base = posixpath.dirname(name) if m.issym() else ""
            target = posixpath.normpath(posixpath.join(base, m.linkname))
            if m.linkname.startswith("/") or target.split("/")[0] != parts[0]:
                raise UnsafeArchiveError(
                    f"archive member {name!r} links outside the bundle ({m.linkname!r})"
                )
        total += max(m.size, 0)
        if total > max_total:
            raise UnsafeArchiveError(f"the archive unpacks to more than {max_total} bytes")
        tops.add(parts[0])
    if len(tops) != 1:
        raise UnsafeArchiveError(f"the archive must hold one bundle folder, found {sorted(tops)}")
    return tops.pop()


def extract_archive(archive: Path, dest: Path, *, max_total: int = MAX_TOTAL_BYTES) -> Path:
    """Extract a bundle archive under ``dest``; returns the bundle folder.

    Raises:
        BundleNotFoundError: not a tar file.
        UnsafeArchiveError: see ``check_members``.
    """
    if not tarfile.is_tarfile(archive):
        raise BundleNotFoundError(f"{archive}: not a bundle archive (tar)")
    with tarfile.open(archive) as tar:
        top = check_members(tar, max_total=max_total)
        dest.mkdir(parents=True, exist_ok=True)
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise UnsafeArchiveError(f"{archive}: {exc}") from exc
    return dest / top
