"""The TensorRT Edge-LLM engine cache: build an engine from a variant's export on first
load on a device, reuse it afterwards, and say when and why it was rebuilt.

An engine is specific to the GPU (or Jetson module) it was built on, the TensorRT release
that built it and its build settings, so the cache key is the sha256 of:

- the export's digest (``folder.export_digest``: engine.json, config.json, model.onnx,
  model.onnx.data and the chat template, each hashed whole),
- the files the builder copies beside llm.engine, which the runtime reads there
  (``copied_files``: the tokenizer files and the embedding, hashed whole),
- the device (NVML's GPU name and compute capability; on a Jetson the device-tree board
  model and the SoC),
- the TensorRT version of the libnvinfer the runtime loaded, the Edge-LLM version,
- the effective build settings (engine.json's, with any load overrides).

Layout under ``<edgekit cache>/engines/tensorrt/``: ``<key>/`` (what the builder wrote:
llm.engine, config.json, the tokenizer files, embedding.safetensors; plus
``edgekit-engine.json``, the facts it was built from), ``<key>.lock`` (two loaders do not
build the same engine twice: the second waits, then reuses), and ``index/<export
digest>.json`` (the facts of the last engine built from that export, so a rebuild says
what changed: "TensorRT 10.3.0 -> 10.7.0", "settings changed: max_input_len 1024 ->
2048"). An entry is published by renaming a finished temporary folder
(``edgekit.atomic.atomic_path``) only after ``build()`` returned True and llm.engine
exists, so an interrupted or failed build leaves neither an entry nor a temporary folder;
an entry that is damaged (no llm.engine, a manifest that is not its own) is rebuilt, and
the reason says so. After a build, the engines of the same export and device that a
TensorRT or Edge-LLM upgrade made unusable are removed (``_evict_obsolete``); engines for
other settings stay, so switching back reuses them.

Before a build starts, the memory it needs (the export's weights, the KV cache at
max_batch x capacity, the runtime's buffers and the builder's workspace) is compared
with the memory the device has available; a build that cannot fit is refused with both
figures. The builder and the device facts come through ``EngineBuilder`` (a Protocol),
so the tests drive all of this with a fake; ``NativeBuilder`` is Edge-LLM's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgekit.converters.tensorrt.folder import (
    EMBEDDING,
    FILES,
    HINT,
    export_digest,
    file_sha256,
)
from edgekit.converters.tensorrt.settings import BATCH, INPUT, OUTPUT, EngineSettings
from edgekit.targets import checks
from edgekit.targets.runtime_calls import backend_errors
from edgekit.targets.tensorrt_memory import (  # noqa: F401 - re-exported
    GIB,
    BuildMemory,
    build_memory,
    check_build_memory,
)

from edgekit.atomic import atomic_path, write_atomic
from edgekit.cache import cache_root
from edgekit.errors import (
    EdgekitError,
    GenerationError,
    ModelFormatError,
    SettingError,
    TargetError,
)
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safe_files import UnsafePathError, open_regular
from edgekit.untrusted import parse_json

if TYPE_CHECKING:
    from edgekit.converters.tensorrt.folder import ExportFolder

log = logging.getLogger(__name__)

ENGINE_FILE = "llm.engine"
MANIFEST = "edgekit-engine.json"
LAYOUT = 1  # the cache layout; a new one keys every engine anew
MANIFEST_BYTES = 64 << 10
MAX_ENTRY_FILES = 256  # an entry holds a dozen files
MAX_CACHE_ENTRIES = 4096  # entries looked at for eviction after a build
STAGE = "build engine"
# the export's files the builder copies beside llm.engine and the runtime reads there
COPIED = ("tokenizer.json", "tokenizer_config.json")
# load settings that override engine.json's build settings -> (field, bounds)
OVERRIDES: dict[str, tuple[str, tuple[int, int]]] = {
    "max_batch": ("max_batch_size", BATCH),
    "max_input": ("max_input_len", INPUT),
    "max_output": ("max_output_len", OUTPUT),
}


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    """What an engine is specific to, and the memory a build may take, on this device."""

    device: str  # "NVIDIA GeForce RTX 4090 (SM 8.9)", "NVIDIA Jetson Orin Nano ... (ORIN)"
    tensorrt: str  # the loaded libnvinfer's version, "10.3.0"
    available_bytes: int  # memory free for the build and the engine (GPU or unified)


class EngineBuilder(Protocol):
    """Edge-LLM's builder and the device facts, injected so the cache logic runs
    without a GPU (tests pass a fake)."""

    edgellm_version: str

    def facts(self) -> DeviceFacts: ...

    def build(self, onnx_dir: Path, engine_dir: Path, settings: EngineSettings) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A cached engine ready for the runtime."""

    path: Path  # the entry folder (llm.engine and what the builder copied beside it)
    key: str
    built: bool  # True: built by this load; False: reused
    reason: str  # why it was built ("first build on ...", what changed), or "reused"
    facts: Mapping[str, Any]


def effective_settings(base: EngineSettings, context: int, **given: Any) -> EngineSettings:
    """``base`` with the load overrides ``max_batch``, ``max_input``, ``max_output``
    (None: engine.json's), each in its range and the capacity within ``context``.

    Raises:
        SettingError: an override of the wrong type, out of range, or a KV-cache
            capacity (max_input + max_output) beyond the model's context.
    """
    changes: dict[str, Any] = {}
    for name, (field, (low, high)) in OVERRIDES.items():
        value = given.get(name)
        if value is not None:
            changes[field] = checks.integer(name, value, low=low, high=high)
    settings = replace(base, **changes) if changes else base
    if settings.max_kv_cache_capacity > context:
        raise SettingError(
            f"max_input + max_output = {settings.max_kv_cache_capacity} tokens is more than "
            f"the model's context ({context:,})",
            hint=f"choose max_input and max_output that add up to at most {context}",
        )
    return settings


def engine_facts(
    folder: ExportFolder, device: DeviceFacts, settings: EngineSettings, edgellm: str
) -> dict[str, Any]:
    """Everything an engine depends on, as the manifest and the index record it."""
    return {
        "layout": LAYOUT,
        "export": export_digest(folder),
        "files": copied_files(folder),
        "device": device.device,
        "tensorrt": device.tensorrt,
        "edgellm": edgellm,
        "settings": settings.to_json(),
    }


def copied_files(folder: ExportFolder) -> dict[str, str]:
    """A sha256 of each file the builder copies into the engine folder, where the runtime
    reads it (export_digest covers none of them), each whole.

    Raises:
        ModelFormatError: a file is missing, a link, or over its size bound.
    """
    out: dict[str, str] = {}
    for name in COPIED:
        rel = f"{folder.llm.name}/{name}"
        try:
            fd = open_regular(folder.root, rel)
        except UnsafePathError as exc:
            raise ModelFormatError(f"{folder.llm / name}: {exc.reason}", hint=HINT) from exc
        h = hashlib.sha256()
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            h.update(f"{size}\0".encode())
            if size > FILES[name]:
                raise ModelFormatError(
                    f"{folder.llm / name}: larger than the {FILES[name]:,} bytes allowed",
                    hint=HINT,
                )
            else:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        out[name] = h.hexdigest()
    # the embedding whole (a fine-tune that trains only embedding rows changes nothing
    # else), memoized per file identity as the weights are
    out[EMBEDDING] = file_sha256(folder.root, f"{folder.llm.name}/{EMBEDDING}")[1]
    return out


def cache_key(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def engine_root() -> Path:
    """Where engines live: ``$EDGEKIT_CACHE`` (else ~/.cache/edgekit) /engines/tensorrt."""
    return cache_root() / "engines" / "tensorrt"


# --- the cache ------------------------------------------------------------------------------


def prepare_engine(
    folder: ExportFolder,
    settings: EngineSettings,
    builder: EngineBuilder,
    *,
    root: Path | None = None,
    progress: ProgressCallback = no_progress,
) -> Engine:
    """The engine for ``folder`` built with ``settings`` on this device: the cached one,
    else one built now (progress events while it builds; the reason in ``Engine``).

    Raises:
        InsufficientMemoryError: a build is needed and predicted not to fit.
        GenerationError: the builder failed (nothing is left in the cache).
        TargetError: the cache folder cannot be written or locked.
    """
    root = root or engine_root()
    device = builder.facts()
    facts = engine_facts(folder, device, settings, builder.edgellm_version)
    key = cache_key(facts)
    entry = root / key
    damage = _damage(entry, key, facts)
    if damage == "":
        return _reused(entry, key, facts, progress)
    with _locked(root, key, progress):
        damage = _damage(entry, key, facts)  # another loader may have built it meanwhile
        if damage == "":
            return _reused(entry, key, facts, progress)
        reason = damage if damage != "absent" else _why_new(root, facts, device)
        check_build_memory(build_memory(folder, settings), device, settings)
        log.info("building a TensorRT engine for %s: %s", folder.root, reason)
        progress(ProgressEvent(stage=STAGE, done=0, total=1, detail=reason))
        _build(folder, settings, builder, entry, key, facts)
        _remember(root, facts)
        _evict_obsolete(root, facts, key)
        progress(ProgressEvent(stage=STAGE, done=1, total=1, detail=f"built: {reason}"))
    return Engine(path=entry, key=key, built=True, reason=reason, facts=facts)


def _reused(entry: Path, key: str, facts: Mapping[str, Any], progress: ProgressCallback) -> Engine:
    progress(ProgressEvent(stage=STAGE, done=1, total=1, detail=f"reused {entry}"))
    return Engine(path=entry, key=key, built=False, reason="reused", facts=facts)


def _damage(entry: Path, key: str, facts: Mapping[str, Any]) -> str:
    """What is wrong with ``entry`` as the engine of ``facts`` (the rebuild's reason):
    "" when nothing is, "absent" when there is no entry."""
    try:
        mode = os.lstat(entry).st_mode
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISDIR(mode):
        return f"the cached entry {entry} is not a folder: rebuilt"
    try:
        engine = os.lstat(entry / ENGINE_FILE)
    except FileNotFoundError:
        return f"the cached engine at {entry} has no {ENGINE_FILE}: rebuilt"
    if not stat.S_ISREG(engine.st_mode) or engine.st_size == 0:
        return f"the cached {ENGINE_FILE} at {entry} is not a non-empty file: rebuilt"
    link = _first_link(entry)
    if link:
        return f"the cached engine at {entry} holds a link ({link}), not what was built: rebuilt"
    recorded = _read_json(entry / MANIFEST)
    if not isinstance(recorded, dict) or recorded.get("key") != key:
        return f"the cached engine at {entry} has a missing or wrong {MANIFEST}: rebuilt"
    if recorded.get("facts") != dict(facts):
        return f"the cached engine at {entry} was built from other facts: rebuilt"
    return ""


def _first_link(entry: Path) -> str:
    """The name of a link among the entry's files (the runtime reads them all, and the
    builder writes none), else ""; a folder too large to be an entry counts as one."""
    try:
        with os.scandir(entry) as items:
            for count, item in enumerate(items):
                if item.is_symlink() or count >= MAX_ENTRY_FILES:
                    return item.name
    except OSError as exc:  # an entry edgekit cannot list is not one it can vouch for
        return f"unreadable: {exc.strerror}"
    return ""


def _read_json(path: Path) -> Any:
    """A small JSON file of the cache, or None when it is missing, a link, oversized or
    malformed (the cache is ours, but a disk fills and a process dies mid-write)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MANIFEST_BYTES + 1)
    try:
        return parse_json(data, where=str(path), max_bytes=MANIFEST_BYTES)
    except EdgekitError:  # a malformed record reads as none
        return None


def _why_new(root: Path, facts: Mapping[str, Any], device: DeviceFacts) -> str:
    """Why there is no engine for ``facts``: what changed since the last engine built
    from this export (the index), or that this is its first build here."""
    last = _read_json(_index(root, facts))
    if not isinstance(last, dict):
        return f"first build on {device.device}"
    changes = []
    for field, label in (
        ("layout", "edgekit's cache layout"),
        ("device", "device"),
        ("tensorrt", "TensorRT"),
        ("edgellm", "Edge-LLM"),
    ):
        if last.get(field) != facts[field]:
            changes.append(f"{label} {last.get(field)} -> {facts[field]}")
    files = last.get("files")
    before: dict[str, Any] = files if isinstance(files, dict) else {}
    changes += [
        f"the export's {name} changed"
        for name, digest in facts["files"].items()
        if before.get(name) != digest
    ]
    recorded = last.get("settings")
    old: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    moved = [
        f"{name} {old.get(name)} -> {value}"
        for name, value in facts["settings"].items()
        if old.get(name) != value
    ]
    if moved:
        changes.append("settings changed: " + ", ".join(moved))
    if not changes:  # the very facts of the last build: its engine was removed
        return f"the engine built from this export on {device.device} is no longer in the cache"
    return "; ".join(changes)


def _index(root: Path, facts: Mapping[str, Any]) -> Path:
    return root / "index" / f"{facts['export']}.json"


def _remember(root: Path, facts: Mapping[str, Any]) -> None:
    """Record ``facts`` as the last engine built from its export (best effort: a
    missing record only makes the next rebuild's reason less precise)."""
    try:
        write_atomic(_index(root, facts), json.dumps(dict(facts), sort_keys=True))
    except (OSError, EdgekitError) as exc:
        log.debug("could not record the engine index: %s", exc)


BUILD_HINT = "the builder's log says why"


def _build(
    folder: ExportFolder,
    settings: EngineSettings,
    builder: EngineBuilder,
    entry: Path,
    key: str,
    facts: Mapping[str, Any],
) -> None:
    """Build into a private temporary folder and rename it to ``entry``; on any failure
    or interruption the temporary folder is removed and ``entry`` is left absent."""
    # the native builder raises RuntimeError and its own types; the cache folder's own
    # failures (a full disk, a damaged entry that cannot be removed) are mapped the same way
    with backend_errors("TensorRT Edge-LLM", "building the engine", hint=BUILD_HINT):
        with contextlib.suppress(FileNotFoundError):
            _discard(entry)  # a damaged entry: never reused, replaced below
        _build_into(folder, settings, builder, entry, key, facts)


def _build_into(
    folder: ExportFolder,
    settings: EngineSettings,
    builder: EngineBuilder,
    entry: Path,
    key: str,
    facts: Mapping[str, Any],
) -> None:
    with atomic_path(entry, force=True) as tmp:
        tmp.mkdir()
        ok = builder.build(folder.llm, tmp, settings)
        if not ok:
            raise GenerationError(
                f"TensorRT Edge-LLM failed to build an engine from {folder.llm}",
                hint="the builder's log above says why; check the GPU's free memory "
                "and that the export came from Edge-LLM " + str(facts["edgellm"]),
            )
        made = tmp / ENGINE_FILE
        if not made.is_file() or made.is_symlink() or made.stat().st_size == 0:
            wrote = ", ".join(sorted(p.name for p in tmp.iterdir())[:8]) or "nothing"
            raise GenerationError(
                f"the TensorRT Edge-LLM builder reported success but wrote no "
                f"{ENGINE_FILE} (it wrote {wrote})",
                hint="report it with the Edge-LLM version; the export may be incomplete",
            )
        manifest = {"key": key, "facts": dict(facts)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))


def _evict_obsolete(root: Path, facts: Mapping[str, Any], key: str) -> None:
    """Remove the engines of this export on this device that it can no longer run: built
    by another TensorRT or Edge-LLM release, or for an older cache layout (a JetPack
    upgrade would otherwise leave gigabytes behind on a Jetson's storage). Engines for
    other settings, or another GPU of this host, stay: switching back reuses them. An
    entry another loader holds locked is left. Best effort: a failure only leaves it."""
    import fcntl  # Edge-LLM runs on Linux only

    try:
        entries = [e for e in os.scandir(root) if e.name != key and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries[:MAX_CACHE_ENTRIES]:
        recorded = _read_json(Path(entry.path) / MANIFEST)
        old = recorded.get("facts") if isinstance(recorded, dict) else None
        if not isinstance(old, dict) or not _obsoleted(old, facts):
            continue
        try:
            fd = os.open(root / f"{entry.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # being built or checked: leave it
            _discard(Path(entry.path))
            log.info("removed an engine this device can no longer run: %s", entry.path)
        except OSError as exc:
            log.debug("kept the engine %s: %s", entry.path, exc)
        finally:
            os.close(fd)  # the lock file stays: unlinking it would let two loaders lock apart


def _obsoleted(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an engine built from ``old`` facts is superseded by one from ``new``: the
    same export on the same device, another release or cache layout."""
    if old.get("export") != new["export"] or old.get("device") != new["device"]:
        return False
    return any(old.get(k) != new[k] for k in ("tensorrt", "edgellm", "layout"))


def _discard(entry: Path) -> None:
    mode = os.lstat(entry).st_mode
    if stat.S_ISDIR(mode):
        shutil.rmtree(entry)
    else:
        entry.unlink()


@contextlib.contextmanager
def _locked(root: Path, key: str, progress: ProgressCallback) -> Iterator[None]:
    """Hold ``<root>/<key>.lock`` exclusively: a second loader of the same engine waits
    for the first one's build (then finds the entry) instead of building it again."""
    import fcntl  # Edge-LLM runs on Linux only

    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise TargetError(
            f"cannot use the engine cache {root}: {exc.strerror}",
            hint="set EDGEKIT_CACHE to a writable folder",
        ) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(
                ProgressEvent(stage=STAGE, done=0, total=None, detail="waiting for another build")
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
