"""The first pass over a bundle archive: every tar header read and checked, nothing written.

Refused: symbolic and hard links, devices, FIFOs, sparse files and any other member type;
names that are absolute, contain ``..``, ``.``, empty components, backslashes or control
characters, are not UTF-8, longer than ``MAX_NAME_BYTES`` or deeper than ``MAX_DEPTH``; a
file at the top (the archive holds one folder); a name twice, or a file where a folder is;
more than ``MAX_MEMBERS`` members or ``MAX_TOTAL_BYTES`` in all; extended headers larger
than ``MAX_EXTENDED_BYTES`` (all those before one member together); a compressed file; a
bad header checksum; an archive cut short (a member's data, a header, or the
end-of-archive marker missing).

``edgekit.archive`` extracts what this pass accepted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from edgekit.errors import BundleIntegrityError, BundleNotFoundError, UnsafeArchiveError
from edgekit.untrusted import clean_text

MAX_TOTAL_BYTES = 256 << 30  # a bundle of a 70B model at 8 bits fits; a tar bomb does not
MAX_MEMBERS = 10_000
MAX_NAME_BYTES = 1024  # bundle paths are a variant folder and a file name
MAX_COMPONENT_BYTES = 255  # NAME_MAX of every common file system
MAX_DEPTH = 32
MAX_EXTENDED_BYTES = 1 << 20  # a pax or GNU long-name header's own data
BLOCK = 512

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
_EXTENDED = (b"x", b"g", b"L")  # pax per-member, pax global, GNU long name


@dataclass(frozen=True)
class Member:
    """A checked member: a regular file or a folder, and where its data lies."""

    name: str
    kind: Literal["file", "dir"]
    offset: int
    size: int


def refuse(name: str, reason: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"archive member {clean_text(name)!r} {reason}")


def _number(field: bytes, what: str, name: str) -> int:
    """A numeric header field: octal text, or GNU base-256 (high bit set)."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            raise refuse(name, f"has a negative {what}")
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
        if data[pos] == 0:  # NUL padding ends the records; checked without a copy per record
            if data.count(0, pos) != len(data) - pos:
                raise refuse(name, "has a malformed extended header")
            break
        space = data.find(b" ", pos, pos + 21)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise refuse(name, "has a malformed extended header") from None
        record = data[pos : pos + length]
        if (
            space < 0
            or length <= space - pos
            or len(record) != length
            or not record.endswith(b"\n")
        ):
            raise refuse(name, "has a malformed extended header")
        key, eq, value = record[space - pos + 1 : -1].partition(b"=")
        if not eq:
            raise refuse(name, "has a malformed extended header")
        try:
            records[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise refuse(name, "has an extended header that is not UTF-8") from None
        pos += length
    return records


def _decode_name(raw: bytes) -> str:
    shown = raw.decode("utf-8", "replace")
    if len(raw) > MAX_NAME_BYTES:
        raise refuse(shown[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse(shown, "has a name that is not UTF-8") from None


def _check_name(name: str, kind: str) -> list[str]:
    """The components of a member name, or the refusal."""
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise refuse(name[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/") or _DRIVE.match(name):
        raise refuse(name, "has an absolute path")
    if "\\" in name:
        raise refuse(name, "contains a backslash (a Windows path separator)")
    if clean_text(name, max_len=MAX_NAME_BYTES + 1) != name:
        raise refuse(name, "contains a control character")
    if kind == "dir" and name.endswith("/"):
        name = name[:-1]
    parts = name.split("/")
    if ".." in parts:
        raise refuse(name, "has a '..' component: it would leave the bundle folder")
    if any(p in ("", ".") for p in parts):
        raise refuse(name, "has an empty or '.' component")
    if len(parts) > MAX_DEPTH:
        raise refuse(name, f"is nested deeper than {MAX_DEPTH} folders")
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        raise refuse(name, f"has a component longer than {MAX_COMPONENT_BYTES} bytes")
    return parts


def _member_kind(typeflag: bytes, name: str, link_target: str) -> Literal["file", "dir"]:
    """A folder or a regular file; every other member type is refused, saying what it is."""
    if typeflag == _DIRECTORY or (typeflag == b"\0" and name.endswith("/")):
        return "dir"
    if typeflag in _REGULAR:
        return "file"
    if typeflag in (b"1", b"2"):
        raise refuse(
            name,
            f"is {_TYPE_WORDS[typeflag]} (to {clean_text(link_target)!r}): bundles hold no links",
        )
    if typeflag in _TYPE_WORDS:
        raise refuse(name, f"is {_TYPE_WORDS[typeflag]}: a bundle holds files and folders only")
    raise refuse(name, f"has member type {typeflag!r}, which a bundle never holds")


class _Layout:
    """What the members so far make: files, folders, the one top folder."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # path -> "file" | "dir" (listed or implied)
        self.listed: set[str] = set()
        self.top: str | None = None

    def add(self, name: str, parts: list[str], kind: str) -> str:
        path = "/".join(parts)
        if len(parts) == 1 and kind == "file":
            raise refuse(
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
                raise refuse(
                    name, f"is inside {clean_text(parent)!r}, which is both a file and a folder"
                )
            self.kinds[parent] = "dir"
        previous = self.kinds.get(path)
        if previous is not None and previous != kind:
            raise refuse(name, "is both a file and a folder")
        if path in self.listed:
            raise refuse(name, "appears twice")
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


@dataclass(frozen=True)
class _Header:
    """One header block, decoded but not yet judged."""

    typeflag: bytes
    raw_name: bytes  # ustar prefix joined
    shown: str  # the raw name, for messages
    size: int
    data_offset: int
    link: str  # the link target field (a link member is refused, naming it)


def _decode_header(block: bytes, offset: int) -> _Header:
    raw_name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix field before the name
        prefix = block[345:500].split(b"\0", 1)[0]
        raw_name = prefix + b"/" + raw_name if prefix else raw_name
    shown = raw_name.decode("utf-8", "replace")
    return _Header(
        typeflag=block[156:157],
        raw_name=raw_name,
        shown=shown,
        size=_number(block[124:136], "size", shown),
        data_offset=offset + BLOCK,
        link=block[157:257].split(b"\0", 1)[0].decode("utf-8", "replace"),
    )


class _Reader:
    """Walks the headers of one archive; pax and GNU extended headers apply to the next
    real member."""

    def __init__(self, f: BinaryIO, archive: Path, max_total: int, max_members: int) -> None:
        self.f, self.archive = f, archive
        self.max_total, self.max_members = max_total, max_members
        self.file_size = os.fstat(f.fileno()).st_size
        self.layout = _Layout()
        self.members: list[Member] = []
        self.total = 0
        self.pending: dict[str, str] = {}  # pax records for the next member
        self.extended = 0  # bytes of extended headers since the last member
        self.long_name: bytes | None = None  # a GNU long name for the next member
        self.offset = 0

    def run(self) -> list[Member]:
        _sniff(self.f, self.archive)
        while (block := self._next_block()) is not None:
            header = _decode_header(block, self.offset)
            self.offset = self._end_of(header.shown, header.data_offset, header.size)
            if header.typeflag in _EXTENDED:
                self._extended(header)
            else:
                self._member(header)
        if self.layout.top is None:
            raise BundleNotFoundError(
                f"{self.archive}: the archive is empty, so it holds no bundle"
            )
        return self.members

    def _next_block(self) -> bytes | None:
        """The next header block, or None at the end-of-archive marker."""
        self.f.seek(self.offset)
        block = _read_block(self.f, "a header is cut short")
        if block == bytes(BLOCK):
            if _read_block(self.f, "no end-of-archive marker") != bytes(BLOCK):
                raise BundleIntegrityError(
                    "the archive has a lone zero block in the middle: corrupt"
                )
            return None
        if not _checksum_ok(block):
            raise BundleIntegrityError(
                f"a header at byte {self.offset:,} has a wrong checksum: corrupt archive"
            )
        return block

    def _end_of(self, name: str, data_offset: int, size: int) -> int:
        """Where the member's data (padded to whole blocks) ends; inside the file."""
        end = data_offset + size + (-size % BLOCK)
        if size < 0 or end > self.file_size:
            raise BundleIntegrityError(
                f"the archive is truncated: member {clean_text(name)!r} needs {size:,} "
                "bytes that the file does not hold"
            )
        return end

    def _extended(self, header: _Header) -> None:
        # The limit holds for all the extended headers before one member together: one
        # after another, each under it, they would pile records up in memory unbounded.
        self.extended += header.size
        if self.extended > MAX_EXTENDED_BYTES:
            raise refuse(
                header.shown,
                f"is an extended header of {header.size:,} bytes, {self.extended:,} with "
                f"those before it for one member (limit {MAX_EXTENDED_BYTES:,})",
            )
        self.f.seek(header.data_offset)
        data = self.f.read(header.size)
        if header.typeflag == b"L":
            self.long_name = data.split(b"\0", 1)[0]
            return
        records = _pax_records(data, header.shown)
        if header.typeflag == b"g":
            if any(
                k in ("path", "linkpath", "size") or k.startswith("GNU.sparse") for k in records
            ):
                raise refuse(header.shown, "is a global header that changes names or sizes")
            return
        self.pending.update(records)

    def _name(self, header: _Header) -> str:
        if "path" in self.pending:
            name = self.pending["path"]
            if len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise refuse(name[:80] + "...", f"is longer than {MAX_NAME_BYTES} bytes")
            return name
        return _decode_name(self.long_name if self.long_name is not None else header.raw_name)

    def _member(self, header: _Header) -> None:
        name = self._name(header)
        pending = self.pending
        size = header.size
        if "size" in pending:
            try:
                size = int(pending["size"])
            except ValueError:
                raise refuse(name, "has an extended size that is not a number") from None
            self.offset = self._end_of(name, header.data_offset, size)
        link_target = pending.get("linkpath") or header.link
        sparse = any(k.startswith("GNU.sparse") for k in pending)
        self.pending, self.long_name, self.extended = {}, None, 0
        if len(self.members) >= self.max_members:
            raise UnsafeArchiveError(f"the archive has more than {self.max_members:,} members")
        if header.typeflag == b"S" or sparse:
            raise refuse(name, "is a sparse file")
        kind = _member_kind(header.typeflag, name, link_target)
        path = self.layout.add(name, _check_name(name, kind), kind)
        if kind == "file":
            self.total += size
        if self.total > self.max_total:
            raise UnsafeArchiveError(f"the archive unpacks to more than {self.max_total:,} bytes")
        self.members.append(
            Member(
                name=path, kind=kind, offset=header.data_offset, size=size if kind == "file" else 0
            )
        )


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
    return _Reader(
        f,
        archive,
        MAX_TOTAL_BYTES if max_total is None else max_total,
        MAX_MEMBERS if max_members is None else max_members,
    ).run()
