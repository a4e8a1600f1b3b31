"""Files written where they must not be: hostile archives, tampered bundle folders,
planted links at temporary names, signals in the middle of ``pack``, and ``pack``'s
validation of every variant before any work.

Every case asserts the specific edgekit error and a useful message, that nothing was
written outside the intended place (a sentinel folder beside it), and that nothing
partial is left behind (the extraction cache, hidden siblings of an output); the CLI
cases assert exit code 1 and no traceback.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.errors import (
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    BundleSchemaError,
    EdgekitError,
    SchemaError,
    TargetUnavailableError,
    UnsafeArchiveError,
    UnsupportedConversionError,
)
from edgekit.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ModelIdentity,
    Provenance,
    RuntimeSettings,
    SourceModel,
    TokenizerInfo,
    Variant,
)
from tests.conftest import require

VICTIM = b"original content\n"


# --- shared helpers ------------------------------------------------------------------------


def snapshot(root: Path, *skip: Path) -> dict[str, str]:
    """Everything under ``root`` (but ``skip``): kind, and content digest or link target."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in [*dirnames, *filenames]:
            p = here / name
            if p in skip:
                continue
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "other"
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A sentinel folder with a victim file: nothing may ever change in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim").write_bytes(VICTIM)
    return folder


def assert_cli_error(args: list[str], fragment: str | None = None) -> str:
    result = CliRunner().invoke(main, args)
    output = result.output
    assert result.exit_code == 1, output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output and "error:" in output, output
    assert "\x1b" not in output, "a terminal escape reached the output"
    if fragment:  # the console wraps long lines: compare the words
        assert " ".join(fragment.lower().split()) in " ".join(output.lower().split()), output
    return output


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".build-" in p.name)


# --- crafted archives ----------------------------------------------------------------------


def tar_bytes(
    *members: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def reg(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def folder(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.devmajor, info.devminor = 1, 3
    return info, None


BASE = (folder("b"), reg("b/manifest.json", b"{}"))


def with_base(*members: tuple[tarfile.TarInfo, bytes | None]) -> Callable[[Path], bytes]:
    return lambda _outside: tar_bytes(*BASE, *members)


def cve_2025_4517_chain(top: str, outside: Path) -> tuple[list[Any], str]:
    """The PATH_MAX realpath bypass: symlinks through 247-character folder names make the
    textual path look deep while the kernel resolves it shallow, so a relative link that
    looks inside the bundle lands outside. Returns the members and the escaping link."""
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[Any] = [folder(top)]
    cur = top
    for s in steps:
        members.append(folder(f"{cur}/{comp}"))
        members.append(link(f"{cur}/{s}", comp))
        cur = f"{cur}/{comp}"
    deep = "/".join(steps) + "/" + "l" * 254
    members.append(link(f"{top}/{deep}", "../" * len(steps)))
    members.append(link(f"{top}/escape", deep + "/.." * 17 + str(outside)))
    return members, f"{top}/escape"


def cve_file(outside: Path) -> bytes:
    members, escape = cve_2025_4517_chain("b", outside)
    return tar_bytes(*members, reg(f"{escape}/pwned", b"pwned"), reg("b/manifest.json", b"{}"))


def cve_hardlink(outside: Path) -> bytes:
    members, escape = cve_2025_4517_chain("b", outside)
    return tar_bytes(
        *members,
        link("b/h", f"{escape}/victim", tarfile.LNKTYPE),
        reg("b/h", b"pwned"),  # written through the hard link: the victim's inode
        reg("b/manifest.json", b"{}"),
    )


def _patch_header(
    data: bytes, index: int, field: slice, value: bytes, *, fix: bool = True
) -> bytes:
    """Rewrite one field of the ``index``-th 512-byte header block (and its checksum)."""
    buf = bytearray(data)
    offset = index * 512
    header = bytearray(buf[offset : offset + 512])
    header[field] = value.ljust(field.stop - field.start, b"\0")[: field.stop - field.start]
    if fix:
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
    buf[offset : offset + 512] = header
    return bytes(buf)


def _header_index(data: bytes, name: bytes) -> int:
    for i in range(len(data) // 512):
        if data[i * 512 : i * 512 + 100].rstrip(b"\0") == name:
            return i
    raise LookupError(name)


def sparse_member(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y" * 600), fmt=tarfile.USTAR_FORMAT)
    return _patch_header(data, _header_index(data, b"b/model.gguf"), slice(156, 157), b"S")


def unknown_type(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y"), fmt=tarfile.USTAR_FORMAT)
    return _patch_header(data, _header_index(data, b"b/model.gguf"), slice(156, 157), b"Z")


def bad_checksum(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y"), fmt=tarfile.USTAR_FORMAT)
    return _patch_header(
        data, _header_index(data, b"b/model.gguf"), slice(100, 108), b"0000777\0", fix=False
    )


def non_utf8_name(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model-xx.gguf", b"y"), fmt=tarfile.USTAR_FORMAT)
    return _patch_header(
        data, _header_index(data, b"b/model-xx.gguf"), slice(0, 100), b"b/model-\xff\xfe.gguf"
    )


def declared_huge(_outside: Path) -> bytes:
    info, _ = reg("b/model.gguf", b"")
    info.size = 1 << 40  # one TiB declared, nothing behind it
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m, d in BASE:
            tar.addfile(m, io.BytesIO(d) if d is not None else None)
        tar.fileobj.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))  # type: ignore[union-attr]
    return buf.getvalue() + b"\0" * 1024


def pax_header_huge(_outside: Path) -> bytes:
    record = b"comment=" + b"z" * (4 << 20) + b"\n"
    length = len(record) + 8
    length = len(record) + len(str(length)) + 1
    body = b"%d %s" % (length, record)
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = len(body)
    head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    payload = head + body + b"\0" * (-len(body) % 512)
    rest = tar_bytes(*BASE, reg("b/model.gguf"), fmt=tarfile.USTAR_FORMAT)
    return payload + rest


def pax_headers_stacked(_outside: Path) -> bytes:
    """Extended headers one after another before one member, each under the limit:
    together they piled records up in memory as large as the archive."""
    headers = b""
    for n in range(3):
        record = b"c%d=" % n + b"z" * (700 << 10) + b"\n"
        length = len(record) + 1
        length = len(record) + len(str(length)) + 1
        body = b"%d %s" % (length, record)
        info = tarfile.TarInfo("././@PaxHeader")
        info.type = tarfile.XHDTYPE
        info.size = len(body)
        head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
        headers += head + body + b"\0" * (-len(body) % 512)
    rest = tar_bytes(*BASE, fmt=tarfile.USTAR_FORMAT)
    return rest[:512] + headers + rest[512:]  # between the folder and the manifest


def pax_path_override(_outside: Path) -> bytes:
    info, data = reg("b/ok.gguf", b"pwned")
    info.pax_headers = {"path": "b/../../outside/pax"}
    return tar_bytes(*BASE, (info, data))


def truncated_in_data(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y" * 8192))
    return data[: _header_index(data, b"b/model.gguf") * 512 + 512 + 3000]


def truncated_in_header(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y" * 100))
    return data[: _header_index(data, b"b/model.gguf") * 512 + 200]


def no_end_marker(_outside: Path) -> bytes:
    data = tar_bytes(*BASE, reg("b/model.gguf", b"y" * 100))
    end = (_header_index(data, b"b/model.gguf") + 2) * 512
    return data[:end]


def gzipped(_outside: Path) -> bytes:
    return gzip.compress(tar_bytes(*BASE, reg("b/model.gguf")))


def many_members(_outside: Path) -> bytes:
    return tar_bytes(*BASE, *(reg(f"b/f{i}") for i in range(60)))


def _good_bundle_tar(outside: Path, edit: Callable[[dict[str, Any]], None] | None) -> bytes:
    root = outside.parent / "src-bundle"
    make_bundle(root, edit=edit)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(root, arcname="b")
    shutil.rmtree(root)
    return buf.getvalue()


@dataclass(frozen=True)
class ArchiveCase:
    build: Callable[[Path], bytes]
    error: type[EdgekitError]
    fragment: str


ARCHIVES: dict[str, ArchiveCase] = {
    "symlink-absolute": ArchiveCase(
        with_base(link("b/model.gguf", "/etc/passwd")), UnsafeArchiveError, "link"
    ),
    "symlink-up": ArchiveCase(with_base(link("b/x", "../../secret")), UnsafeArchiveError, "link"),
    "symlink-inside": ArchiveCase(
        with_base(link("b/alias", "manifest.json")), UnsafeArchiveError, "link"
    ),
    "symlink-dangling": ArchiveCase(
        with_base(link("b/alias", "nothing")), UnsafeArchiveError, "link"
    ),
    "symlink-then-file": ArchiveCase(
        lambda o: tar_bytes(*BASE, link("b/sub", str(o)), reg("b/sub/pwned")),
        UnsafeArchiveError,
        "link",
    ),
    "symlink-top-folder": ArchiveCase(
        lambda o: tar_bytes(link("b", str(o)), reg("b/pwned")), UnsafeArchiveError, "link"
    ),
    "cve-2025-4517-file": ArchiveCase(cve_file, UnsafeArchiveError, "link"),
    "cve-2025-4517-hardlink": ArchiveCase(cve_hardlink, UnsafeArchiveError, "link"),
    "hardlink-out": ArchiveCase(
        with_base(link("b/h", "etc/shadow", tarfile.LNKTYPE)), UnsafeArchiveError, "link"
    ),
    "hardlink-inside": ArchiveCase(
        with_base(link("b/h", "b/manifest.json", tarfile.LNKTYPE)), UnsafeArchiveError, "link"
    ),
    "hardlink-missing": ArchiveCase(
        with_base(link("b/h", "b/nothing", tarfile.LNKTYPE)), UnsafeArchiveError, "link"
    ),
    "char-device": ArchiveCase(
        with_base(special("b/null", tarfile.CHRTYPE)), UnsafeArchiveError, "device"
    ),
    "block-device": ArchiveCase(
        with_base(special("b/sda", tarfile.BLKTYPE)), UnsafeArchiveError, "device"
    ),
    "fifo": ArchiveCase(with_base(special("b/pipe", tarfile.FIFOTYPE)), UnsafeArchiveError, "fifo"),
    "absolute": ArchiveCase(with_base(reg("/etc/cron.d/evil")), UnsafeArchiveError, "absolute"),
    "dot-dot": ArchiveCase(with_base(reg("b/../../evil")), UnsafeArchiveError, ".."),
    "dot-dot-deep": ArchiveCase(with_base(reg("b/x/../../../evil")), UnsafeArchiveError, ".."),
    "dot-component": ArchiveCase(with_base(reg("b/./model.gguf")), UnsafeArchiveError, "component"),
    "empty-component": ArchiveCase(
        with_base(reg("b//model.gguf")), UnsafeArchiveError, "component"
    ),
    "backslash": ArchiveCase(with_base(reg("b\\..\\..\\evil")), UnsafeArchiveError, "backslash"),
    "drive-letter": ArchiveCase(with_base(reg("C:/evil")), UnsafeArchiveError, "absolute"),
    "control-characters": ArchiveCase(
        with_base(reg("b/\x1b[2J\x1b]0;pwned\x07.gguf")), UnsafeArchiveError, "control"
    ),
    "non-utf8-name": ArchiveCase(non_utf8_name, UnsafeArchiveError, "UTF-8"),
    "huge-name": ArchiveCase(
        with_base(reg("b/" + "x" * 100_000)), UnsafeArchiveError, "longer than"
    ),
    "deep-name": ArchiveCase(with_base(reg("b/" + "d/" * 400 + "f")), UnsafeArchiveError, "deeper"),
    "gnu-longname-escape": ArchiveCase(
        lambda o: tar_bytes(
            *BASE, reg("b/" + "x/" * 60 + "../" * 70 + "evil"), fmt=tarfile.GNU_FORMAT
        ),
        UnsafeArchiveError,
        "..",
    ),
    "pax-path-override": ArchiveCase(pax_path_override, UnsafeArchiveError, ".."),
    "pax-headers-stacked": ArchiveCase(
        pax_headers_stacked, UnsafeArchiveError, "with those before it"
    ),
    "top-level-file-only": ArchiveCase(
        lambda o: tar_bytes(reg("manifest.json", b"{}")), UnsafeArchiveError, "top"
    ),
    "top-level-file-beside": ArchiveCase(with_base(reg("evil.sh")), UnsafeArchiveError, "top"),
    "two-folders": ArchiveCase(
        lambda o: tar_bytes(*BASE, reg("c/manifest.json")), UnsafeArchiveError, "one bundle folder"
    ),
    "duplicate-member": ArchiveCase(
        with_base(reg("b/manifest.json", b'{"evil": 1}')), UnsafeArchiveError, "twice"
    ),
    "file-then-folder": ArchiveCase(
        with_base(reg("b/x"), reg("b/x/y")), UnsafeArchiveError, "both a file and a folder"
    ),
    "folder-then-file": ArchiveCase(
        with_base(folder("b/x"), reg("b/x")), UnsafeArchiveError, "both a file and a folder"
    ),
    "sparse": ArchiveCase(sparse_member, UnsafeArchiveError, "sparse"),
    "unknown-type": ArchiveCase(unknown_type, UnsafeArchiveError, "type"),
    "bad-checksum": ArchiveCase(bad_checksum, BundleIntegrityError, "checksum"),
    "declared-huge": ArchiveCase(declared_huge, BundleIntegrityError, "truncated"),
    "pax-header-huge": ArchiveCase(pax_header_huge, UnsafeArchiveError, "header"),
    "truncated-in-data": ArchiveCase(truncated_in_data, BundleIntegrityError, "truncated"),
    "truncated-in-header": ArchiveCase(truncated_in_header, BundleIntegrityError, "truncated"),
    "no-end-marker": ArchiveCase(no_end_marker, BundleIntegrityError, "truncated"),
    "empty-file": ArchiveCase(lambda o: b"", BundleNotFoundError, "not a bundle archive"),
    "not-a-tar": ArchiveCase(
        lambda o: os.urandom(3000), BundleNotFoundError, "not a bundle archive"
    ),
    "gzip-compressed": ArchiveCase(gzipped, UnsafeArchiveError, "compressed"),
    "too-many-members": ArchiveCase(many_members, UnsafeArchiveError, "members"),
    "bundle-with-bad-entry": ArchiveCase(
        lambda o: _good_bundle_tar(
            o, lambda m: m["variants"][0].update(entry="../../outside/victim")
        ),
        BundleSchemaError,
        "entry",
    ),
    "bundle-without-manifest": ArchiveCase(
        lambda o: tar_bytes(folder("b"), reg("b/model.gguf")), BundleNotFoundError, "manifest.json"
    ),
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EDGEKIT_CACHE", str(root))
    return root


def _cache_leftovers(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_hostile_archive(
    case: str, tmp_path: Path, outside: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgekit.archive_headers
    from edgekit.bundle_open import open_bundle

    monkeypatch.setattr(edgekit.archive_headers, "MAX_MEMBERS", 50)
    spec = ARCHIVES[case]
    archive = tmp_path / f"{case}.tar"
    archive.write_bytes(spec.build(outside))
    before = snapshot(tmp_path, cache)

    with pytest.raises(spec.error) as info:
        open_bundle(archive)
    assert spec.fragment.lower() in info.value.message.lower(), info.value.message
    assert "\x1b" not in info.value.message
    assert snapshot(tmp_path, cache) == before, "something changed outside the cache"
    assert (outside / "victim").read_bytes() == VICTIM
    assert _cache_leftovers(cache / "bundles") == [], "the failed extraction left files"

    assert_cli_error(["verify", str(archive)], spec.fragment)
    assert _cache_leftovers(cache / "bundles") == []
    assert snapshot(tmp_path, cache) == before


def test_archive_size_cap_and_free_space(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgekit.archive
    from edgekit.bundle_open import open_bundle

    archive = tmp_path / "big.tar"
    archive.write_bytes(tar_bytes(*BASE, reg("b/model.gguf", b"\0" * 5000)))
    with pytest.raises(UnsafeArchiveError, match="more than 1,?000 bytes"):
        edgekit.archive.extract_archive(archive, tmp_path / "out", max_total=1000)
    assert not (tmp_path / "out").exists()

    def nearly_full(path: Any) -> Any:
        return shutil._ntuple_diskusage(10 << 30, 10 << 30, 100)  # type: ignore[attr-defined]

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    with pytest.raises(BundleError, match="free"):
        open_bundle(archive)
    assert _cache_leftovers(cache / "bundles") == []


def test_extracted_files_keep_no_special_modes(tmp_path: Path, cache: Path) -> None:
    from edgekit.archive import extract_archive

    archive = tmp_path / "modes.tar"
    archive.write_bytes(tar_bytes(*BASE, reg("b/tool", b"#!/bin/sh\n", mode=0o6777)))
    top = extract_archive(archive, tmp_path / "out")
    mode = (top / "tool").stat().st_mode
    assert not mode & 0o7000 and not mode & 0o002  # no setuid/setgid/sticky, not world-writable


# --- crafted bundle folders ----------------------------------------------------------------

MODEL = b"GGUF" + bytes(252)


def _entry(path: str, data: bytes) -> FileEntry:
    return FileEntry(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def make_bundle(
    root: Path,
    *,
    model: bytes | Path = MODEL,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A bundle folder: a llama.cpp variant (one file) and an OpenVINO one (a folder)."""
    (root / "gguf-q4_k_m").mkdir(parents=True)
    gguf = root / "gguf-q4_k_m" / "model.gguf"
    if isinstance(model, Path):
        os.link(model, gguf)
    else:
        gguf.write_bytes(model)
    ov = {
        "openvino-int4/openvino_model.xml": b"<net/>",
        "openvino-int4/openvino_model.bin": b"\0" * 64,
    }
    (root / "openvino-int4").mkdir()
    for rel, data in ov.items():
        (root / rel).write_bytes(data)
    gguf_sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    variants = (
        Variant(
            name="gguf-q4_k_m",
            target="llamacpp",
            format="gguf",
            quant="Q4_K_M",
            recipe={},
            entry="gguf-q4_k_m/model.gguf",
            files=(
                FileEntry(path="gguf-q4_k_m/model.gguf", size=gguf.stat().st_size, sha256=gguf_sha),
            ),
            runtime=RuntimeSettings(context=256),
        ),
        Variant(
            name="openvino-int4",
            target="openvino",
            format="openvino",
            quant="INT4",
            recipe={},
            entry="openvino-int4",
            files=tuple(_entry(rel, data) for rel, data in ov.items()),
            runtime=RuntimeSettings(context=256),
        ),
    )
    manifest = Manifest(
        schema_version=1,
        name="b",
        model=ModelIdentity(
            name="m",
            family="llama",
            architecture="LlamaForCausalLM",
            parameters=1,
            context_length=2048,
            source=SourceModel(path="m", format="gguf", sha256="0" * 64),
        ),
        tokenizer=TokenizerInfo(kind=None),
        variants=variants,
        provenance=Provenance(
            edgekit_version="0", created="2025-01-01T00:00:00+00:00", backends={}, host="h"
        ),
    )
    data = asdict(manifest)
    if edit is not None:
        edit(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data, indent=1))
    return root


def _rewrite_manifest(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _gguf(root: Path) -> Path:
    return root / "gguf-q4_k_m" / "model.gguf"


def _set_entry(value: str) -> Callable[[Path, Path], None]:
    return lambda root, outside: _rewrite_manifest(
        root, lambda m: m["variants"][0].update(entry=value)
    )


def _symlink_same_content(root: Path, outside: Path) -> None:
    copy = outside / "same.gguf"
    shutil.copyfile(_gguf(root), copy)
    _gguf(root).unlink()
    _gguf(root).symlink_to(copy)


def _symlink_to_secret(root: Path, outside: Path) -> None:
    secret = outside / "victim"
    _gguf(root).unlink()
    _gguf(root).symlink_to(secret)
    _rewrite_manifest(
        root,
        lambda m: m["variants"][0]["files"][0].update(
            size=len(VICTIM), sha256=hashlib.sha256(VICTIM).hexdigest()
        ),
    )


def _symlink_folder(root: Path, outside: Path) -> None:
    shutil.copytree(root / "gguf-q4_k_m", outside / "g")
    shutil.rmtree(root / "gguf-q4_k_m")
    (root / "gguf-q4_k_m").symlink_to(outside / "g")


def _symlink_manifest(root: Path, outside: Path) -> None:
    shutil.move(root / MANIFEST_NAME, outside / MANIFEST_NAME)
    (root / MANIFEST_NAME).symlink_to(outside / MANIFEST_NAME)


def _fifo(root: Path, outside: Path) -> None:
    _gguf(root).unlink()
    os.mkfifo(_gguf(root))


def _directory(root: Path, outside: Path) -> None:
    _gguf(root).unlink()
    _gguf(root).mkdir()


def _manifest_text(text: str | bytes) -> Callable[[Path, Path], None]:
    def write(root: Path, outside: Path) -> None:
        path = root / MANIFEST_NAME
        path.write_bytes(text.encode() if isinstance(text, str) else text)

    return write


def _manifest_edit(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    return lambda root, outside: _rewrite_manifest(root, edit)


def _repeated_key(root: Path, outside: Path) -> None:
    path = root / MANIFEST_NAME
    text = path.read_text()
    path.write_text(text.replace('"name": "b"', '"name": "b", "name": "evil"', 1))


def _huge_float(root: Path, outside: Path) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["variants"][0]["measured"]["decode_tok_s"] = 0.5
    text = json.dumps(data).replace('"decode_tok_s": 0.5', '"decode_tok_s": 1' + "0" * 400, 1)
    path.write_text(text)


def _extra_file_in_folder_entry(root: Path, outside: Path) -> None:
    (root / "openvino-int4" / "openvino_tokenizer.xml").write_bytes(b"<planted/>")


def _symlink_in_folder_entry(root: Path, outside: Path) -> None:
    (root / "openvino-int4" / "openvino_tokenizer.xml").symlink_to(outside / "victim")


def _duplicate_files(root: Path, outside: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        files = m["variants"][0]["files"]
        files.append(dict(files[0]))

    _rewrite_manifest(root, edit)


def _unlisted_entry(root: Path, outside: Path) -> None:
    shutil.copyfile(_gguf(root), root / "gguf-q4_k_m" / "other.gguf")
    _rewrite_manifest(root, lambda m: m["variants"][0].update(entry="gguf-q4_k_m/other.gguf"))


@dataclass(frozen=True)
class FolderCase:
    prepare: Callable[[Path, Path], None]
    error: type[EdgekitError]
    fragment: str
    variant: str = "gguf-q4_k_m"


FOLDERS: dict[str, FolderCase] = {
    "entry-absolute": FolderCase(_set_entry("/etc/passwd"), BundleSchemaError, "entry"),
    "entry-dot-dot": FolderCase(_set_entry("../outside/victim"), BundleSchemaError, "entry"),
    "entry-unlisted": FolderCase(_unlisted_entry, BundleSchemaError, "entry"),
    "entry-other-variant": FolderCase(
        _set_entry("openvino-int4/openvino_model.bin"), BundleSchemaError, "entry"
    ),
    "entry-empty": FolderCase(_set_entry(""), BundleSchemaError, "entry"),
    "entry-nul": FolderCase(_set_entry("gguf-q4_k_m/model.gguf\0.txt"), BundleSchemaError, "entry"),
    "file-symlink-same-content": FolderCase(_symlink_same_content, BundleIntegrityError, "link"),
    "file-symlink-to-secret": FolderCase(_symlink_to_secret, BundleIntegrityError, "link"),
    "folder-symlink": FolderCase(_symlink_folder, BundleIntegrityError, "link"),
    "manifest-symlink": FolderCase(_symlink_manifest, BundleError, "link"),
    "file-is-fifo": FolderCase(_fifo, BundleIntegrityError, "model.gguf"),
    "file-is-folder": FolderCase(_directory, BundleIntegrityError, "model.gguf"),
    "files-listed-twice": FolderCase(_duplicate_files, BundleSchemaError, "twice"),
    "file-path-backslash": FolderCase(
        _manifest_edit(
            lambda m: m["variants"][0]["files"][0].update(path="gguf-q4_k_m\\..\\..\\x")
        ),
        BundleSchemaError,
        "backslash",
    ),
    "file-path-nul": FolderCase(
        _manifest_edit(lambda m: m["variants"][0]["files"][0].update(path="gguf-q4_k_m/m\0")),
        BundleSchemaError,
        "path",
    ),
    "folder-entry-unlisted-file": FolderCase(
        _extra_file_in_folder_entry, BundleIntegrityError, "not listed", "openvino-int4"
    ),
    "folder-entry-symlink": FolderCase(
        _symlink_in_folder_entry, BundleIntegrityError, "link", "openvino-int4"
    ),
    "manifest-huge": FolderCase(
        _manifest_text('{"schema_version": 1, "pad": "' + "x" * (20 << 20) + '"}'),
        BundleSchemaError,
        "bytes",
    ),
    "manifest-deep": FolderCase(
        _manifest_text("[" * 100_000 + "]" * 100_000), BundleSchemaError, "nested"
    ),
    "manifest-repeated-key": FolderCase(_repeated_key, BundleSchemaError, "twice"),
    "manifest-nan": FolderCase(
        _manifest_edit(lambda m: m["variants"][0]["measured"].update(watts=float("nan"))),
        BundleSchemaError,
        "NaN",
    ),
    "manifest-not-utf8": FolderCase(
        _manifest_text(b'{"name": "\xff\xfe"}'), BundleSchemaError, "UTF-8"
    ),
    "manifest-huge-number": FolderCase(_huge_float, BundleSchemaError, "decode_tok_s"),
    "manifest-negative-size": FolderCase(
        _manifest_edit(lambda m: m["variants"][0]["files"][0].update(size=-1)), BundleError, "-1"
    ),
    "manifest-list": FolderCase(_manifest_text("[1, 2]"), BundleSchemaError, "version"),
}


class FakeTarget:
    """Stands in for a runtime: records what it was asked to load."""

    loaded: list[Path] = []

    def load(self, path: Path, **settings: Any) -> Any:
        FakeTarget.loaded.append(Path(path))

        class Session:
            bundle: Any = None
            variant: Any = None

        return Session()


@pytest.fixture
def fake_target(monkeypatch: pytest.MonkeyPatch) -> type[FakeTarget]:
    """Every registered target's ``load`` replaced by the recorder (the rest of each
    target, its settings, devices and availability, stays real)."""
    from edgekit.targets.registry import all_targets

    FakeTarget.loaded = []

    def record(cls: Any, path: Path, **settings: Any) -> Any:
        return FakeTarget().load(path, **settings)

    for target in all_targets():
        monkeypatch.setattr(target, "load", classmethod(record))
    return FakeTarget


@pytest.fixture(scope="session")
def linkable_gguf(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model copied once onto the tests' file system, to hard-link from."""
    dest = tmp_path_factory.mktemp("linkable") / "model.gguf"
    shutil.copyfile(default_gguf, dest)
    return dest


@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_hostile_bundle_folder(
    case: str, tmp_path: Path, outside: Path, fake_target: type[FakeTarget]
) -> None:
    import edgekit
    from edgekit.bundle_open import open_bundle, verify_bundle

    spec = FOLDERS[case]
    root = make_bundle(tmp_path / "b")
    spec.prepare(root, outside)
    before = snapshot(tmp_path)

    def check(call: Callable[[], Any]) -> None:
        with pytest.raises(spec.error) as info:
            call()
        assert spec.fragment.lower() in info.value.message.lower(), info.value.message

    check(lambda: verify_bundle(root, open_bundle(root).manifest, checksums=True))
    check(lambda: edgekit.load(root, variant=spec.variant, verify=True, force=True))
    check(lambda: edgekit.load(root, variant=spec.variant, force=True))
    assert fake_target.loaded == [], "an unverified file reached the runtime"
    assert_cli_error(["verify", str(root)], spec.fragment)
    assert snapshot(tmp_path) == before
    assert (outside / "victim").read_bytes() == VICTIM


def test_good_crafted_bundle_verifies_and_loads(
    tmp_path: Path, linkable_gguf: Path, fake_target: type[FakeTarget]
) -> None:
    """The control for the table above: the same bundle, untampered, is accepted."""
    import edgekit
    from edgekit.bundle_open import open_bundle, verify_bundle

    root = make_bundle(tmp_path / "b", model=linkable_gguf)
    verify_bundle(root, open_bundle(root).manifest, checksums=True)
    edgekit.load(root, variant="gguf-q4_k_m", verify=True, force=True)
    assert fake_target.loaded == [root / "gguf-q4_k_m" / "model.gguf"]
    result = CliRunner().invoke(main, ["verify", str(root)])
    assert result.exit_code == 0, result.output


# --- planted links at temporary names, and the readers of edgekit's own files ------------


def _plant(link_path: Path, target: Path) -> None:
    link_path.parent.mkdir(parents=True, exist_ok=True)
    link_path.symlink_to(target)


def write_update_variant(tmp_path: Path, outside: Path) -> None:
    from edgekit.bundle_open import open_bundle, update_variant
    from edgekit.manifest import Figures

    root = make_bundle(tmp_path / "b")
    _plant(root / "manifest.json.tmp", outside / "victim")
    update_variant(root, "gguf-q4_k_m", measured=Figures(decode_tok_s=12.5, source="test"))
    assert open_bundle(root).manifest.variant("gguf-q4_k_m").measured.decode_tok_s == 12.5


def _sample() -> Any:
    from edgekit.converters.planner.fitting import Sample

    return Sample(
        key="b#v@2",
        bytes_per_token=1e6,
        decode_s_per_token=1e-3,
        flops_per_token=None,
        prefill_s_per_token=None,
        weights_bytes=1,
        kv_used_bytes=0,
        vocab_term_bytes=0,
        memory_bytes=None,
        watts=None,
        recorded="2025-01-01",
    )


def write_calibration(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import calibration

    _plant(calibration.calibration_file().with_name("calibration.json.tmp"), outside / "victim")
    calibration.record("dev", "llamacpp", "cpu", _sample())
    assert len(calibration.samples("dev", "llamacpp", "cpu")) == 1


def write_calibration_over_link(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import calibration

    (outside / "cal.json").write_text(json.dumps({"version": 1, "devices": {}}))
    _plant(calibration.calibration_file(), outside / "cal.json")
    before = (outside / "cal.json").read_bytes()
    calibration.record("dev", "llamacpp", "cpu", _sample())
    assert (outside / "cal.json").read_bytes() == before
    (outside / "cal.json").unlink()


def write_quality(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import quality

    _plant(quality.calibration_file().with_suffix(".tmp"), outside / "victim")
    quality.record("llamacpp", "Q4_K_M", 0.01)
    assert quality.expected_kl("llamacpp", "Q4_K_M") == (0.01, "measured here (edgekit eval)")


def write_safetensors_over_link(tmp_path: Path, outside: Path) -> None:
    import numpy as np
    from edgekit.converters.tensor_io import write_safetensors

    _plant(tmp_path / "work" / "model.safetensors", outside / "victim")
    write_safetensors(
        tmp_path / "work" / "model.safetensors", [("w", (2,))], [np.zeros(2, np.float32)]
    )


def write_atomic_over_link_folder(tmp_path: Path, outside: Path) -> None:
    from edgekit.atomic import atomic_path

    _plant(tmp_path / "out", outside)
    with atomic_path(tmp_path / "out", force=True) as tmp:
        tmp.mkdir()
        (tmp / "x").write_text("new")
    assert (tmp_path / "out").is_dir() and not (tmp_path / "out").is_symlink()


def read_calibration_deep(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import calibration

    calibration.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    calibration.calibration_file().write_text('{"version": 1, "devices": ' + "[" * 100_000)
    calibration.samples("dev", "llamacpp", "cpu")


def read_calibration_huge(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import calibration

    calibration.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    pad = "x" * (40 << 20)
    calibration.calibration_file().write_text(json.dumps({"version": 1, "devices": {}, "pad": pad}))
    calibration.samples("dev", "llamacpp", "cpu")


def read_calibration_bad_sample(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import calibration

    calibration.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    sample = {**asdict(_sample()), "decode_s_per_token": "fast"}
    data = {"version": 1, "devices": {"dev": {"llamacpp/cpu": {"k": sample}}}}
    calibration.calibration_file().write_text(json.dumps(data))
    calibration.samples("dev", "llamacpp", "cpu")


def read_quality_not_numbers(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import quality

    quality.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    quality.calibration_file().write_text(json.dumps({"llamacpp:Q4_K_M": "lots"}))
    quality.expected_kl("llamacpp", "Q4_K_M")


def read_quality_deep(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import quality

    quality.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    quality.calibration_file().write_text("[" * 100_000)
    quality.expected_kl("llamacpp", "Q4_K_M")


def read_quality_not_utf8(tmp_path: Path, outside: Path) -> None:
    from edgekit.converters.planner import quality

    quality.calibration_file().parent.mkdir(parents=True, exist_ok=True)
    quality.calibration_file().write_bytes(b'{"\xff": 1}')
    quality.expected_kl("llamacpp", "Q4_K_M")


def update_variant_symlinked_manifest(tmp_path: Path, outside: Path) -> None:
    from edgekit.bundle_open import update_variant
    from edgekit.manifest import Figures

    root = make_bundle(tmp_path / "b")
    _symlink_manifest(root, outside)
    update_variant(root, "gguf-q4_k_m", measured=Figures(decode_tok_s=1.0))


@dataclass(frozen=True)
class WriteCase:
    run: Callable[[Path, Path], None]
    error: type[EdgekitError] | None = None  # None: the write succeeds
    fragment: str = ""


WRITES: dict[str, WriteCase] = {
    "update-variant-planted-tmp": WriteCase(write_update_variant),
    "update-variant-symlinked-manifest": WriteCase(
        update_variant_symlinked_manifest, BundleError, "link"
    ),
    "calibration-planted-tmp": WriteCase(write_calibration),
    "calibration-file-is-link": WriteCase(write_calibration_over_link),
    "quality-planted-tmp": WriteCase(write_quality),
    "safetensors-over-link": WriteCase(write_safetensors_over_link, EdgekitError, "exists"),
    "atomic-output-over-folder-link": WriteCase(write_atomic_over_link_folder),
    "calibration-deep": WriteCase(read_calibration_deep, SchemaError, "nested"),
    "calibration-huge": WriteCase(read_calibration_huge, SchemaError, "bytes"),
    "calibration-bad-sample": WriteCase(
        read_calibration_bad_sample, SchemaError, "decode_s_per_token"
    ),
    "quality-not-numbers": WriteCase(read_quality_not_numbers, SchemaError, "lots"),
    "quality-deep": WriteCase(read_quality_deep, SchemaError, "nested"),
    "quality-not-utf8": WriteCase(read_quality_not_utf8, SchemaError, "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(WRITES))
def test_hostile_write(case: str, tmp_path: Path, outside: Path, cache: Path) -> None:
    spec = WRITES[case]
    if spec.error is None:
        spec.run(tmp_path, outside)
    else:
        with pytest.raises(spec.error) as info:
            spec.run(tmp_path, outside)
        assert spec.fragment.lower() in info.value.message.lower(), info.value.message
    assert (outside / "victim").read_bytes() == VICTIM
    assert {p.name for p in outside.iterdir()} <= {"victim", MANIFEST_NAME}
    if (outside / MANIFEST_NAME).exists():  # the case's own link target: left as it was
        assert json.loads((outside / MANIFEST_NAME).read_text())["variants"][0]["measured"] == {
            k: None
            for k in (
                "memory_bytes",
                "prefill_tok_s",
                "decode_tok_s",
                "watts",
                "joules_per_token",
                "source",
            )
        }
    leftovers = [p.name for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".partial-" in p.name]
    assert leftovers == []


# --- pack validates every variant before any work ------------------------------------------


class WorkStarted(Exception):
    """Raised by the stand-in converter: pack started converting."""


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import edgekit.converters.convert as convert

    calls: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise WorkStarted(f"converting {args[:2]}")

    monkeypatch.setattr(convert, "convert_model", refuse)
    monkeypatch.setattr(convert, "convert_along", refuse)  # what pack runs per variant
    return calls


def _hf_folder(tmp_path: Path, family: str, *, tokenizer: bool = True) -> Path:
    from edgekit.architectures import dimensions_from_config, expected_tensors, family_for_hf
    from tests.builders import tiny_config, write_hf_folder

    config = tiny_config(family)
    fam = family_for_hf(config["model_type"], config.get("architectures"))
    dims = dimensions_from_config(config, fam, "t")
    tensors = {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}
    folder = write_hf_folder(tmp_path / family, config, tensors)
    if tokenizer:
        (folder / "tokenizer.json").write_text(
            json.dumps(
                {
                    "added_tokens": [],
                    "pre_tokenizer": {"type": "ByteLevel"},
                    "model": {"type": "BPE", "vocab": {}, "merges": []},
                }
            )
        )
        (folder / "tokenizer_config.json").write_text("{}")
    return folder


HIDE_OPENVINO = ("optimum", "optimum.intel", "openvino", "openvino_tokenizers", "nncf")


@dataclass(frozen=True)
class PackCase:
    source: str  # "gguf" (the default model) or an HF family
    variants: tuple[tuple[str, str], ...]  # (target, quant)
    error: type[EdgekitError]
    fragment: str
    recipe: str | None = None
    context: int | None = None
    hide: tuple[str, ...] = ()
    tokenizer: bool = True
    name: str | None = None  # the bundle's name (its folder inside an archive)


PACKS: dict[str, PackCase] = {
    "openvino-missing": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("openvino", "INT4")),
        TargetUnavailableError,
        "openvino",
        hide=HIDE_OPENVINO,
    ),
    "llamacpp-missing": PackCase(
        "gguf",
        (("llamacpp", "Q8_0"), ("llamacpp", "Q4_K_M")),
        TargetUnavailableError,
        "llama",
        hide=("llama_cpp",),
    ),
    "openvino-group-size": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("openvino", "INT4")),
        UnsupportedConversionError,
        "group_size",
        recipe="group_size=48",
    ),
    "openvino-kv-cache": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("openvino", "INT4")),
        UnsupportedConversionError,
        "kv",
        recipe="kv_cache=q4_0",
    ),
    "openvino-calibration-missing": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("openvino", "INT4")),
        UnsupportedConversionError,
        "calibration",
        recipe="calibration=/nonexistent/text.txt",
    ),
    "openvino-family": PackCase(
        "gemma3",
        (("llamacpp", "Q8_0"), ("openvino", "INT4")),
        UnsupportedConversionError,
        "openvino",
    ),
    "openvino-no-tokenizer": PackCase(
        "llama",
        (("llamacpp", "Q8_0"), ("openvino", "INT8")),
        UnsupportedConversionError,
        "tokenizer",
        tokenizer=False,
    ),
    "duplicate-variant": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("llamacpp", "q4_k_m")),
        UnsupportedConversionError,
        "twice",
    ),
    "float-from-gguf": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"), ("llamacpp", "F16")),
        UnsupportedConversionError,
        "already GGUF",
    ),
    "context-negative": PackCase(
        "gguf", (("llamacpp", "Q4_K_M"),), UnsupportedConversionError, "context", context=-5
    ),
    "bundle-name-escape": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"),),
        UnsupportedConversionError,
        "bundle name",
        name="../../evil",
    ),
    "bundle-name-control": PackCase(
        "gguf",
        (("llamacpp", "Q4_K_M"),),
        UnsupportedConversionError,
        "bundle name",
        name="b\x1b[2J",
    ),
    "context-zero": PackCase(
        "gguf", (("llamacpp", "Q4_K_M"),), UnsupportedConversionError, "context", context=0
    ),
}


# NNCF's group sizes are checked by building its config, which imports optimum-intel
# (about 20 s the first time in a process).
_SLOW_PACKS = {"openvino-group-size"}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c in _SLOW_PACKS else c for c in sorted(PACKS)],
)
def test_pack_refuses_every_bad_variant_before_work(
    case: str,
    tmp_path: Path,
    default_gguf: Path,
    no_work: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edgekit.bundle import VariantRequest, pack

    spec = PACKS[case]
    source = (
        default_gguf
        if spec.source == "gguf"
        else _hf_folder(tmp_path, spec.source, tokenizer=spec.tokenizer)
    )
    for name in spec.hide:
        monkeypatch.setitem(sys.modules, name, None)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    requests = [
        VariantRequest(target=t, quant=q, recipe=spec.recipe, context=spec.context)
        for t, q in spec.variants
    ]
    with pytest.raises(spec.error) as info:
        pack(source, out_dir / "b", requests, name=spec.name, archive=spec.name is not None)
    assert spec.fragment.lower() in info.value.message.lower(), info.value.message
    assert no_work == [], "pack converted a variant before refusing another"
    assert list(out_dir.iterdir()) == []
    assert {p.name for p in tmp_path.iterdir()} <= {"out", spec.source}, (
        "pack wrote outside its output folder"
    )

    quant = ",".join(f"{t}:{q}" for t, q in spec.variants)
    args = ["pack", str(source), "--quant", quant, "-o", str(out_dir / "b")]
    args += ["--recipe", spec.recipe] if spec.recipe else []
    args += ["--context", str(spec.context)] if spec.context is not None else []
    args += ["--name", spec.name, "--archive"] if spec.name is not None else []
    assert_cli_error(args, spec.fragment)
    assert no_work == [] and list(out_dir.iterdir()) == []


# --- signals and stale hidden siblings -----------------------------------------------------

# The child runs the real `edgekit pack` command (click's main) in its own process. Its
# conversion is a stand-in that writes into the output's hidden sibling and then either
# sleeps (to be signalled mid-work) or copies the real model (to finish).
CHILD = textwrap.dedent(
    """
    import os, shutil, sys, time
    from pathlib import Path

    import edgekit.atomic
    import edgekit.converters.convert as convert

    mode, model, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    edgekit.atomic.interrupt_on_termination()

    def stand_in(route, src, spec, out, **kwargs):
        out = Path(out)
        if mode == "finish":
            shutil.copyfile(model, out)
            return convert.ConvertResult(path=out, format="gguf", quant="Q4_K_M", seconds=0.0, warnings=())
        with open(out, "wb") as f:
            f.write(b"\\0" * (1 << 20))
        marker.write_text(str(os.getpid()))
        time.sleep(120)

    if mode != "real":
        convert.convert_along = stand_in
    from edgekit.cli import main

    main(sys.argv[4:], prog_name="edgekit")
    """
)


def _child(
    tmp_path: Path, mode: str, model: Path, out: Path, marker: Path
) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            mode,
            str(model),
            str(marker),
            "pack",
            str(model),
            "--quant",
            "Q4_K_M",
            "-o",
            str(out),
            "--force",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def _wait_for(marker: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child ended early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the child never started converting")
        time.sleep(0.05)


def sigterm_mid_pack(tmp_path: Path, model: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _child(tmp_path, "sleep", model, out_dir / "b", tmp_path / "started")
    _wait_for(tmp_path / "started", proc)
    assert hidden_leftovers(out_dir), "the child should be working in a hidden sibling"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in stderr, stderr
    assert list(out_dir.iterdir()) == [], "SIGTERM left hidden folders behind"


def stale_siblings_cleaned(tmp_path: Path, model: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    killed = _child(tmp_path, "sleep", model, out_dir / "b", tmp_path / "started")
    _wait_for(tmp_path / "started", killed)
    killed.kill()  # SIGKILL: nothing can clean up
    killed.communicate(timeout=60)
    assert hidden_leftovers(out_dir), "the killed child left nothing to clean (test precondition)"
    done = _child(tmp_path, "finish", model, out_dir / "b", tmp_path / "unused")
    _, stderr = done.communicate(timeout=120)
    assert done.returncode == 0, stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["b"], "stale siblings were kept"


def live_siblings_kept(tmp_path: Path, model: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    working = _child(tmp_path, "sleep", model, out_dir / "b", tmp_path / "started")
    try:
        _wait_for(tmp_path / "started", working)
        theirs = hidden_leftovers(out_dir)
        assert theirs
        done = _child(tmp_path, "finish", model, tmp_path / "out" / "b", tmp_path / "unused")
        _, stderr = done.communicate(timeout=120)
        assert done.returncode == 0, stderr
        assert set(theirs) <= set(hidden_leftovers(out_dir)), (
            "a running pack's folders were deleted"
        )
        assert working.poll() is None
    finally:
        working.send_signal(signal.SIGTERM)
        working.communicate(timeout=60)


SIGNALS: dict[str, Callable[[Path, Path], None]] = {
    "sigterm-mid-pack": sigterm_mid_pack,
    "stale-siblings-cleaned": stale_siblings_cleaned,
    "live-siblings-kept": live_siblings_kept,
}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("case", sorted(SIGNALS))
def test_signals_and_stale_siblings(case: str, tmp_path: Path, linkable_gguf: Path) -> None:
    SIGNALS[case](tmp_path, linkable_gguf)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_during_a_real_quantization(tmp_path: Path, linkable_gguf: Path) -> None:
    """The same, with llama.cpp really quantizing (on a worker thread) when SIGTERM comes."""
    require("llama_cpp", "packing quantizes with llama.cpp")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _child(tmp_path, "real", linkable_gguf, out_dir / "b", tmp_path / "unused")
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 0 for p in out_dir.rglob("*.gguf") if p.is_file()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the quantization never started writing"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in stderr, stderr
    assert list(out_dir.iterdir()) == [], "SIGTERM left hidden folders behind"


def test_load_passes_progress_only_to_a_target_that_reports_it(
    tmp_path: Path, linkable_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """edgekit.load(progress=...) reaches a target whose load_settings name it (TensorRT
    builds an engine on the first load), and no other: llama.cpp would refuse the setting."""
    from edgekit.targets.llamacpp import LlamaCppTarget

    import edgekit

    given: list[dict[str, Any]] = []

    def record(cls: Any, path: Path, **settings: Any) -> Any:
        given.append(settings)
        return SimpleSession()

    monkeypatch.setattr(LlamaCppTarget, "load", classmethod(record))
    root = make_bundle(tmp_path / "b", model=linkable_gguf)
    events: list[Any] = []
    edgekit.load(root, variant="gguf-q4_k_m", force=True, progress=events.append)
    assert "progress" not in given[-1]
    monkeypatch.setattr(
        LlamaCppTarget, "load_settings", (*LlamaCppTarget.load_settings, "progress")
    )
    edgekit.load(root, variant="gguf-q4_k_m", force=True, progress=events.append)
    assert given[-1]["progress"] == events.append


class SimpleSession:
    bundle: Any = None
    variant: Any = None
