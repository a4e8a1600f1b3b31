"""Opening bundles: a folder, or an archive extracted safely (once) into the cache;
verifying their files against the manifest; recording results into a folder's manifest.

Everything here reads the bundle as untrusted: the manifest through
``edgekit.manifest.read_manifest``, every file through ``edgekit.safe_files`` (no link
followed, regular files only), archives through ``edgekit.archive``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from edgekit.archive import extract_archive
from edgekit.atomic import work_dir, write_atomic
from edgekit.cache import cache_root
from edgekit.errors import BundleError, BundleIntegrityError, BundleNotFoundError
from edgekit.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    OpenedBundle,
    Variant,
    read_manifest,
)
from edgekit.safe_files import UnsafePathError, kind_of, open_regular, walk_no_follow
from edgekit.untrusted import clean_text

_CHUNK = 1 << 20


def sha256_file(path: Path, chunk: int = _CHUNK) -> str:
    with path.open("rb") as f:
        return sha256_of(f, chunk)


def sha256_of(f: BinaryIO, chunk: int = _CHUNK) -> str:
    """The sha256 of what is left to read in ``f``."""
    h = hashlib.sha256()
    while block := f.read(chunk):
        h.update(block)
    return h.hexdigest()


def cache_folder() -> Path:
    """Where archives are extracted: $EDGEKIT_CACHE, else ~/.cache/edgekit."""
    return cache_root() / "bundles"


def open_bundle(path: str | Path) -> OpenedBundle:
    """A bundle folder, or an archive extracted (once) into the cache.

    Raises:
        BundleNotFoundError: nothing at ``path``, or no manifest.json in it.
        BundleSchemaError: the manifest is invalid or of an unknown version.
        UnsafeArchiveError: the archive was refused.
    """
    if not isinstance(path, str | os.PathLike):
        raise BundleNotFoundError(
            f"a bundle path is a string or a Path, not {type(path).__name__}",
            hint="pass the bundle's folder or .tar file",
        )
    if "\0" in os.fspath(path):
        raise BundleNotFoundError(
            f"{clean_text(os.fspath(path))!r}: a bundle path cannot contain a NUL byte"
        )
    path = Path(path).expanduser()
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such bundle")
    if path.is_file():
        path = _extracted(path)
    elif not path.is_dir():
        raise BundleNotFoundError(f"{path}: neither a bundle folder nor a bundle archive")
    return OpenedBundle(folder=path, manifest=read_manifest(path))


def _extracted(archive: Path) -> Path:
    """The bundle folder of ``archive`` in the cache, extracted (safely) the first time.

    The extraction goes into a private hidden folder and is renamed into place only when
    the archive was accepted and its manifest read: a refused archive leaves nothing in
    the cache. A cache entry that is not one real folder with a manifest is replaced.
    """
    dest = cache_folder() / _cache_key(archive)
    cached = _cached_bundle(dest)
    if cached is not None:
        return cached
    with work_dir(dest, "partial") as box:
        staged = box / dest.name
        top = extract_archive(archive, staged)
        read_manifest(top)
        _install(staged, dest, box)
    folder = _cached_bundle(dest)
    if folder is None:
        raise BundleError(f"{archive}: the extracted bundle disappeared from {dest}")
    return folder


def _cache_key(archive: Path) -> str:
    """Which cache entry is ``archive``'s. Size and modification time alone let an archive
    rewritten in place (its mtime set back, or a coarse clock) reuse the old extraction;
    the inode and the change time (which no one can set back) catch that."""
    st = archive.stat()
    facts = (archive.resolve(), st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, st.st_ctime_ns)
    return hashlib.sha256("\0".join(map(str, facts)).encode()).hexdigest()[:16]


def _install(staged: Path, dest: Path, box: Path) -> None:
    """Rename the extraction ``staged`` into place at ``dest``. Another process that
    extracted the same archive meanwhile wins (its entry may be in use: it is never moved
    away); only a damaged entry is moved into ``box`` (removed with it) and replaced."""
    if _renamed_into(staged, dest):
        return
    aside = box / "damaged"
    try:
        os.rename(dest, aside)
    except FileNotFoundError:
        pass  # another process moved it aside first
    except OSError as exc:
        raise BundleError(
            f"cannot replace the damaged cache entry {dest}: {exc.strerror}",
            hint="remove it, or set EDGEKIT_CACHE to another folder",
        ) from exc
    if _cached_bundle(aside) is not None:  # finished by another process since we looked
        staged = aside  # put it back rather than ours
    if not _renamed_into(staged, dest):
        raise BundleError(f"cannot install the extracted bundle at {dest}")


def _renamed_into(staged: Path, dest: Path) -> bool:
    """Whether ``dest`` now holds a finished entry: ``staged`` renamed there, or another
    process's (a rename never replaces a folder that holds files)."""
    try:
        os.rename(staged, dest)
    except OSError:
        return _cached_bundle(dest) is not None
    return True


def _cached_bundle(dest: Path) -> Path | None:
    """The bundle folder in a cache entry: exactly one real folder, holding a manifest,
    owned by this user (in a cache folder others can write to, an entry planted at the
    predictable key by someone else is not trusted: it is replaced)."""
    try:
        st = os.lstat(dest)
        if not stat.S_ISDIR(st.st_mode) or not _owned(st):
            return None
        entries = list(os.scandir(dest))
    except OSError:
        return None
    if len(entries) != 1 or not entries[0].is_dir(follow_symlinks=False):
        return None
    folder = Path(entries[0].path)
    try:
        inner, manifest = os.lstat(folder), os.lstat(folder / MANIFEST_NAME)
    except OSError:
        return None
    ok = stat.S_ISREG(manifest.st_mode) and _owned(inner) and _owned(manifest)
    return folder if ok else None


def _owned(st: os.stat_result) -> bool:
    """Whether this user owns what ``st`` describes (always, where there are no uids)."""
    getuid = getattr(os, "getuid", None)
    return getuid is None or st.st_uid == getuid()


def verify_bundle(folder: Path, manifest: Manifest, *, checksums: bool = True) -> None:
    """Check every file's presence and size, and its sha256 when ``checksums``.

    Raises:
        BundleIntegrityError: every mismatch found, listed.
    """
    verify_variants(folder, manifest.variants, checksums=checksums)


def verify_variants(folder: Path, variants: tuple[Variant, ...], *, checksums: bool) -> None:
    """``verify_bundle`` for some variants only (a damaged variant nobody loads is no obstacle).

    Every listed file must be a regular file inside the bundle, reached through real
    folders (no symbolic link anywhere on its path), of the listed size (and checksum);
    a variant whose entry is a folder must hold its listed files and nothing else.

    Raises:
        BundleIntegrityError: every problem found, listed.
    """
    problems: list[str] = []
    for variant in variants:
        for entry in variant.files:
            problem = _check_file(folder, entry, checksums=checksums)
            if problem:
                problems.append(f"{clean_text(entry.path)}: {problem}")
        if variant.entry not in {f.path for f in variant.files}:
            problems.extend(_check_folder_entry(folder, variant))
    if problems:
        raise BundleIntegrityError(f"{folder}: " + "; ".join(problems))


def _check_file(folder: Path, entry: FileEntry, *, checksums: bool) -> str | None:
    try:
        fd = open_regular(folder, entry.path)
    except UnsafePathError as exc:
        return exc.reason
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            return f"{size} bytes, the manifest says {entry.size}"
        if checksums and sha256_of(f) != entry.sha256:
            return "sha256 differs from the manifest"
    return None


def _check_folder_entry(folder: Path, variant: Variant) -> list[str]:
    """A folder the target loads as a whole: nothing in it that was not verified."""
    listed = {f.path for f in variant.files}
    try:
        found = walk_no_follow(folder, variant.entry)
    except UnsafePathError as exc:
        return [f"{clean_text(variant.entry)}: {exc.reason}"]
    problems = []
    for rel, mode in found:
        if stat.S_ISDIR(mode) or rel in listed:
            continue
        what = kind_of(mode)
        problems.append(f"{clean_text(rel)}: {what} in the variant's folder that is not listed")
    return problems


def update_variant(bundle: str | Path, variant: str, **changes: Any) -> Manifest:
    """Rewrite one variant's fields (``quality``, ``measured``, ...) in a bundle folder's
    manifest, atomically. Returns the new manifest.

    Raises:
        BundleError: the bundle cannot be opened, is an archive, or lacks the variant.
    """
    opened = open_bundle(bundle)
    if Path(bundle).is_file():
        raise BundleError(
            f"{bundle} is an archive: results are recorded in bundle folders only",
            hint="unpack it (tar xf) and record into the folder",
        )
    opened.manifest.variant(variant)  # raises for an unknown variant
    manifest = replace(
        opened.manifest,
        variants=tuple(
            replace(v, **changes) if v.name == variant else v for v in opened.manifest.variants
        ),
    )
    write_atomic(opened.folder / MANIFEST_NAME, manifest.to_json())
    return manifest
