"""Atomic outputs: build beside the destination, verify, then rename into place.

An interrupted or failed run leaves no half-written file or folder at the destination;
the temporary sibling is removed on any exception, KeyboardInterrupt included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from edgekit.errors import OutputExistsError


def check_destination(dest: Path, *, force: bool) -> None:
    """Fail early, before any work, when ``dest`` exists and ``force`` is not set.

    Raises:
        OutputExistsError: the destination exists.
    """
    if dest.exists() and not force:
        raise OutputExistsError(
            f"{dest} already exists", hint="pass --force (force=True) to replace it"
        )


@contextlib.contextmanager
def atomic_path(dest: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success it replaces ``dest``.

    The caller writes a file or a folder at the yielded path. On success the previous
    ``dest`` (if ``force``) is removed and the new one renamed in; on failure the
    temporary path is deleted and ``dest`` is untouched.

    Raises:
        OutputExistsError: ``dest`` exists and ``force`` is not set.
    """
    dest = Path(dest)
    check_destination(dest, force=force)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if not tmp.exists():
            return
        if dest.exists():
            _remove(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
