"""Bundle archives: one uncompressed .tar of the bundle folder, read by edgekit's own reader.

A bundle needs regular files and folders, nothing else, so that is all this reader
accepts; it does not rely on tarfile's extraction (nor its ``data`` filter, which a chain
of symbolic links through long names gets past: CVE-2025-4517). Two passes:

1. **Headers** (nothing is written): every member is read and checked before any byte
   is extracted. Refused: symbolic and hard links, devices, FIFOs, sparse files and any
   other member type; names that are absolute, contain ``..``, ``.``, empty components,
   backslashes or control characters, are not UTF-8, longer than ``MAX_NAME_BYTES`` or
   deeper than ``MAX_DEPTH``; a file at the top (the archive holds one folder); a name
   twice, or a file where a folder is; more than ``MAX_MEMBERS`` members or
   ``MAX_TOTAL_BYTES`` in all; extended headers larger than ``MAX_EXTENDED_BYTES``; a
   compressed file; a bad header checksum; an archive cut short (a member's data, a
   header, or the end-of-archive marker missing); more data than the free space.
2. **Extraction**: every folder is opened relative to its parent with
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
import re
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from edgekit.errors import (
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    UnsafeArchiveError,
)
from edgekit.safe_files import DIR_FLAGS, HAS_DIR_FD, kind_of
from edgekit.untrusted import clean_text

MAX_TOTAL_BYTES = 256 << 30  # a bundle of a 70B model at 8 bits fits; a tar bomb does not
MAX_MEMBERS = 10_000
MAX_NAME_BYTES = 1024  # bundle paths are a variant folder and a file name
MAX_COMPONENT_BYTES = 255  # NAME_MAX of every common file system
MAX_DEPTH = 32
MAX_EXTENDED_BYTES = 1 << 20  # a pax or GNU long-name header's own data
BLOCK = 512
_COPY_CHUNK = 1 << 20
_OPEN_DIRS = 64  # folder descriptors kept open while extracting

_COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
    b"PK\x03\x04": "zip",
}
_TYPE_WORDS = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a FIFO",
    b"7": "a contiguous file",
    b"S": "a sparse file",
    b"K": "a long link name",
    b"V": "a volume label",
    b"M": "a multi-volume continuation",
    b"D": "a GNU dump folder",
}
_DRIVE = re.compile(r"^[A-Za-z]:")
_REGULAR = (b"0", b"\0")
_DIRECTORY = b"5"


@dataclass(frozen=True)
class Member:
    """A checked member: a regular file or a folder, and where its data lies."""

    name: str
    kind: Literal["file", "dir"]
    offset: int
    size: int


def _refuse(name: str, reason: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"archive member {clean_text(name)!r} {reason}")


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


# --- reading headers -------------------------------------------------------------------------


def _number(field: bytes, what: str, name: str) -> int:
    """A numeric header field: octal text, or GNU base-256 (high bit set)."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            raise _refuse(name, f"has a negative {what}")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise BundleIntegrityError(
            f"archive member {clean_text(name)!r}: its {what} is not a number (corrupt header)"
        ) from None


def _checksum_ok(block: bytes) -> bool:
    stored = block[148:156].split(b"\0", 1)[0].strip(b" ")
    try:
        expected = int(stored, 8)
    except ValueError:
        return False
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = sum((b - 256 if b > 127 else b) for b in block[:148] + block[156:]) + 8 * 32
    return expected in (unsigned, signed)


def _pax_records(data: bytes, name: str) -> dict[str, str]:
    """Parse ``"%d key=value\\n"`` records (POSIX.1-2001 extended header)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:].strip(b"\0") == b"":
            break
        space = data.find(b" ", pos, pos + 21)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise _refuse(name, "has a malformed extended header") from None
        record = data[pos : pos + length]
        if (
            space < 0
            or length <= space - pos
            or len(record) != length
            or not record.endswith(b"\n")
        ):
            raise _refuse(name, "has a malformed extended header")
        key, eq, value = record[space - pos + 1 : -1].partition(b"=")
        if not eq:
            raise _refuse(name, "has a malformed extended header")
        try:
            records[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(name, "has an extended header that is not UTF-8") from None
        pos += length
    return records


def _decode_name(raw: bytes) -> str:
    shown = raw.decode("utf-8", "replace")
    if len(raw) > MAX_NAME_BYTES:
        raise _refuse(shown[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(shown, "has a name that is not UTF-8") from None


def _check_name(name: str, kind: str) -> list[str]:
    """The components of a member name, or the refusal."""
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise _refuse(name[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/") or _DRIVE.match(name):
        raise _refuse(name, "has an absolute path")
    if "\\" in name:
        raise _refuse(name, "contains a backslash (a Windows path separator)")
    if clean_text(name, max_len=MAX_NAME_BYTES + 1) != name:
        raise _refuse(name, "contains a control character")
    if kind == "dir" and name.endswith("/"):
        name = name[:-1]
    parts = name.split("/")
    if ".." in parts:
        raise _refuse(name, "has a '..' component: it would leave the bundle folder")
    if any(p in ("", ".") for p in parts):
        raise _refuse(name, "has an empty or '.' component")
    if len(parts) > MAX_DEPTH:
        raise _refuse(name, f"is nested deeper than {MAX_DEPTH} folders")
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        raise _refuse(name, f"has a component longer than {MAX_COMPONENT_BYTES} bytes")
    return parts


class _Layout:
    """What the members so far make: files, folders, the one top folder."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # path -> "file" | "dir" (listed or implied)
        self.listed: set[str] = set()
        self.top: str | None = None

    def add(self, name: str, parts: list[str], kind: str) -> str:
        path = "/".join(parts)
        if len(parts) == 1 and kind == "file":
            raise _refuse(
                name, "is a file at the top of the archive: a bundle archive holds one folder"
            )
        if self.top is None:
            self.top = parts[0]
        elif parts[0] != self.top:
            raise UnsafeArchiveError(
                f"the archive must hold one bundle folder, found {sorted({self.top, parts[0]})}"
            )
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if self.kinds.get(parent) == "file":
                raise _refuse(
                    name, f"is inside {clean_text(parent)!r}, which is both a file and a folder"
                )
            self.kinds[parent] = "dir"
        previous = self.kinds.get(path)
        if previous is not None and previous != kind:
            raise _refuse(name, "is both a file and a folder")
        if path in self.listed:
            raise _refuse(name, "appears twice")
        self.listed.add(path)
        self.kinds[path] = kind
        return path


def _read_block(f: BinaryIO, where: str) -> bytes:
    block = f.read(BLOCK)
    if len(block) != BLOCK:
        raise BundleIntegrityError(f"the archive is truncated ({where})")
    return block


def _sniff(f: BinaryIO, archive: Path) -> None:
    head = f.read(BLOCK)
    f.seek(0)
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise UnsafeArchiveError(
                f"{archive} is compressed ({kind}): a bundle archive is an uncompressed .tar",
                hint="decompress it first (e.g. gunzip) and open the .tar, or pass the folder",
            )
    if len(head) < BLOCK or not _checksum_ok(head):
        raise BundleNotFoundError(f"{archive}: not a bundle archive (tar)")


def read_members(
    f: BinaryIO,
    archive: Path,
    *,
    max_total: int | None = None,
    max_members: int | None = None,
) -> list[Member]:
    """Check every header of an open archive; returns its files and folders.

    Raises:
        BundleNotFoundError: not a tar file.
        UnsafeArchiveError: a member a bundle never holds, or limits exceeded.
        BundleIntegrityError: a corrupt header or a truncated archive.
    """
    max_total = MAX_TOTAL_BYTES if max_total is None else max_total
    max_members = MAX_MEMBERS if max_members is None else max_members
    _sniff(f, archive)
    size = os.fstat(f.fileno()).st_size
    layout = _Layout()
    members: list[Member] = []
    total = 0
    pending: dict[str, str] = {}
    long_name: bytes | None = None
    offset = 0
    while True:
        f.seek(offset)
        block = _read_block(f, "a header is cut short")
        if block == bytes(BLOCK):
            if _read_block(f, "no end-of-archive marker") != bytes(BLOCK):
                raise BundleIntegrityError(
                    "the archive has a lone zero block in the middle: corrupt"
                )
            break
        if not _checksum_ok(block):
            raise BundleIntegrityError(
                f"a header at byte {offset:,} has a wrong checksum: corrupt archive"
            )
        raw_name = block[:100].split(b"\0", 1)[0]
        if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix field before the name
            prefix = block[345:500].split(b"\0", 1)[0]
            raw_name = prefix + b"/" + raw_name if prefix else raw_name
        shown = raw_name.decode("utf-8", "replace")
        typeflag = block[156:157]
        member_size = _number(block[124:136], "size", shown)
        data_offset = offset + BLOCK
        end = data_offset + member_size + (-member_size % BLOCK)
        if end > size:
            raise BundleIntegrityError(
                f"the archive is truncated: member {clean_text(shown)!r} needs {member_size:,} "
                f"bytes that the file does not hold"
            )
        offset = end
        if typeflag in (b"x", b"g", b"L"):
            if member_size > MAX_EXTENDED_BYTES:
                raise _refuse(
                    shown,
                    f"is an extended header of {member_size:,} bytes "
                    f"(limit {MAX_EXTENDED_BYTES:,})",
                )
            f.seek(data_offset)
            data = f.read(member_size)
            if typeflag == b"L":
                long_name = data.split(b"\0", 1)[0]
                continue
            records = _pax_records(data, shown)
            if typeflag == b"g":
                if any(
                    k in ("path", "linkpath", "size") or k.startswith("GNU.sparse") for k in records
                ):
                    raise _refuse(shown, "is a global header that changes names or sizes")
                continue
            pending.update(records)
            continue
        if "path" in pending:
            name = pending["path"]
            if len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise _refuse(name[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
        else:
            name = _decode_name(long_name if long_name is not None else raw_name)
        sparse = any(k.startswith("GNU.sparse") for k in pending)
        if "size" in pending:
            try:
                member_size = int(pending["size"])
            except ValueError:
                raise _refuse(name, "has an extended size that is not a number") from None
            end = data_offset + member_size + (-member_size % BLOCK)
            if member_size < 0 or end > size:
                raise BundleIntegrityError(
                    f"the archive is truncated: member {clean_text(name)!r} needs {member_size:,} "
                    "bytes that the file does not hold"
                )
            offset = end
        link_target = pending.get("linkpath") or block[157:257].split(b"\0", 1)[0].decode(
            "utf-8", "replace"
        )
        pending, long_name = {}, None
        if len(members) >= max_members:
            raise UnsafeArchiveError(f"the archive has more than {max_members:,} members")
        if typeflag == b"S" or sparse:
            raise _refuse(name, "is a sparse file")
        if typeflag == _DIRECTORY or (typeflag == b"\0" and name.endswith("/")):
            kind: Literal["file", "dir"] = "dir"
        elif typeflag in _REGULAR:
            kind = "file"
        elif typeflag in (b"1", b"2"):
            raise _refuse(
                name,
                f"is {_TYPE_WORDS[typeflag]} (to {clean_text(link_target)!r}): "
                "bundles hold no links",
            )
        elif typeflag in _TYPE_WORDS:
            raise _refuse(
                name, f"is {_TYPE_WORDS[typeflag]}: a bundle holds files and folders only"
            )
        else:
            raise _refuse(name, f"has member type {typeflag!r}, which a bundle never holds")
        parts = _check_name(name, kind)
        path = layout.add(name, parts, kind)
        if kind == "file":
            total += member_size
        if total > max_total:
            raise UnsafeArchiveError(f"the archive unpacks to more than {max_total:,} bytes")
        members.append(
            Member(
                name=path, kind=kind, offset=data_offset, size=member_size if kind == "file" else 0
            )
        )
    if layout.top is None:
        raise BundleNotFoundError(f"{archive}: the archive is empty, so it holds no bundle")
    return members


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
        return _refuse(name, "appears twice (this file system sees two members as one name)")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return _refuse(name, "has a link or a file in the way of its folder")
    if exc.errno == errno.ENAMETOOLONG:
        return _refuse(name, "has a name too long for this file system")
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
                    raise _refuse(name, "did not land where it was written (a folder changed)")
            st = os.lstat(dest / name)
            real = os.path.realpath(dest / name)
        except OSError as exc:
            raise _refuse(name, "did not land where it was written") from exc
        if (
            not stat.S_ISREG(st.st_mode)
            or (st.st_dev, st.st_ino) != (dev, ino)
            or st.st_nlink != 1
            or os.path.commonpath([root, real]) != root
        ):
            raise _refuse(name, "did not land where it was written")


def list_members(archive: Path) -> list[Member]:
    """The members of a bundle archive, checked as ``extract_archive`` checks them
    (nothing is extracted).

    Raises:
        BundleNotFoundError, UnsafeArchiveError, BundleIntegrityError: as extract_archive.
    """
    with open(archive, "rb") as f:
        return read_members(f, archive)
