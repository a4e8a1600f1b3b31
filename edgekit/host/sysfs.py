"""Reading /sys, /proc and /etc files under a root that may be a recorded tree.

The host readers take a ``root`` so tests run against recorded trees; a live /sys is itself
a maze of links (/sys/class/hwmon/hwmon1 -> ../../devices/..., /etc/nvpmodel.conf ->
/etc/nvpmodel/<board>.conf). Links are therefore followed, but resolved *inside* the root
the way a chroot would see them: an absolute target starts again at ``root``, and a target
that climbs above ``root`` is refused rather than followed to the machine's own files.

Reads are bounded (a sysfs attribute is at most a page) and refuse FIFOs, devices and
folders, so a hostile tree can neither hang a reader nor make it allocate. Between the
resolution and the open a link could be swapped; the last component is opened with
O_NOFOLLOW and checked with fstat, which is what a recorded or live /sys needs.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from edgekit.safe_files import kind_of
from edgekit.untrusted import clean_text

MAX_ATTR_BYTES = 4096  # sysfs attributes are at most one page
MAX_CONF_BYTES = 256 * 1024  # nvpmodel.conf files are ~10 KB
MAX_ENTRIES = 4096  # a sysfs folder holds tens of entries
MAX_LINKS = 16
_INT = re.compile(r"-?\d{1,15}")
_O_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class TreeError(Exception):
    """A file under the root is missing, unsafe or malformed; the message says which and why."""


class TreeMissing(TreeError):
    """A component of the path does not exist."""


def resolve(root: Path, rel: str) -> Path:
    """The real path of ``root/rel``, every link on the way resolved inside ``root``.

    Raises:
        TreeError: missing, a link loop, or a link pointing outside ``root``.
    """
    pending = [p for p in rel.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not done:
                raise TreeError(f"{root}/{rel}: climbs above {root}")
            done.pop()
            continue
        here = root.joinpath(*done, part)
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            raise TreeMissing(f"{here}: missing") from None
        except OSError as exc:
            raise TreeError(f"{here}: cannot be read ({exc.strerror})") from exc
        if not stat.S_ISLNK(mode):
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            raise TreeError(f"{root}/{rel}: more than {MAX_LINKS} links (a loop?)")
        target = os.readlink(here)
        if target.startswith("/"):
            done = []  # an absolute link starts again at the root, as in a chroot
        parts = [p for p in target.split("/") if p not in ("", ".")]
        if _climbs_out(done, parts):
            raise TreeError(f"{here}: a link to {clean_text(target)}, outside {root}")
        pending = parts + pending
    return root.joinpath(*done)


def _climbs_out(base: list[str], parts: list[str]) -> bool:
    depth = len(base)
    for p in parts:
        depth += -1 if p == ".." else 1
        if depth < 0:
            return True
    return False


def read_text(root: Path, rel: str, *, max_bytes: int = MAX_ATTR_BYTES) -> str:
    """The text of the regular file ``root/rel`` (links resolved inside ``root``).

    Raises:
        TreeError: missing, not a regular file (FIFO, device, folder), larger than
            ``max_bytes``, unreadable.
    """
    path = resolve(root, rel)
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError as exc:
        raise TreeError(f"{path}: cannot be opened ({exc.strerror})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TreeError(f"{path}: {kind_of(mode)}, not a regular file")
        os.set_blocking(fd, True)
        data = b""
        while len(data) <= max_bytes:  # a read may return less than asked: read to EOF
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise TreeError(f"{path}: cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TreeError(f"{path}: larger than the {max_bytes:,} bytes such a file holds")
    return data.decode("utf-8", errors="replace")


def read_label(root: Path, rel: str) -> str:
    """A one-line name (a rail label, a device model): NULs and whitespace stripped,
    control characters refused."""
    text = read_text(root, rel).replace("\x00", "").strip()
    if not text or "\n" in text or not text.isprintable():
        raise TreeError(f"{root}/{rel}: not a one-line name ({clean_text(text)!r})")
    return text


def read_int(root: Path, rel: str) -> int:
    """A decimal integer attribute.

    Raises:
        TreeError: unreadable (see read_text) or not a decimal integer.
    """
    text = read_text(root, rel).strip()
    if not _INT.fullmatch(text):
        raise TreeError(f"{root}/{rel}: not a number ({clean_text(text, max_len=40)!r})")
    return int(text)


def list_dir(root: Path, rel: str) -> list[str]:
    """The sorted names in the folder ``root/rel`` (links resolved inside ``root``); [] when
    it is missing.

    Raises:
        TreeError: a link out of the root, not a folder, or implausibly many entries.
    """
    try:
        path = resolve(root, rel)
    except TreeMissing:
        return []
    if not path.is_dir() or path.is_symlink():
        raise TreeError(f"{path}: not a folder")
    names: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > MAX_ENTRIES:
                raise TreeError(f"{path}: more than {MAX_ENTRIES} entries")
    return sorted(names)


def exists(root: Path, rel: str) -> bool:
    """Whether ``root/rel`` resolves inside ``root`` to something that exists."""
    try:
        resolve(root, rel)
    except TreeError:
        return False
    return True
