"""Property-based fuzzing of the bundle readers: the manifest parser and the archive
extractor (bounded by the "edgekit" hypothesis profile of tests/conftest.py;
EDGEKIT_FUZZ_EXAMPLES runs longer).

Properties:

- ``parse_manifest`` on any JSON document, on a valid manifest with one part replaced,
  dropped or added, and on its bytes flipped or cut, returns a Manifest whose paths and
  entries are safe, or raises a BundleError; never any other exception.
- ``extract_archive`` on a generated tar (random member types, names, sizes, formats,
  then possibly flipped or cut bytes) either extracts exactly the archive's files and
  folders, all inside the root and agreeing with Python's tarfile, or raises a
  BundleError and leaves nothing; never writes outside the root.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, reject  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgekit.archive import extract_archive  # noqa: E402
from edgekit.errors import BundleError  # noqa: E402
from edgekit.manifest import (  # noqa: E402
    FileEntry,
    Manifest,
    ModelIdentity,
    Provenance,
    RuntimeSettings,
    SourceModel,
    TokenizerInfo,
    Variant,
    parse_manifest,
)
from edgekit.safe_files import split_relative  # noqa: E402

pytestmark = pytest.mark.fuzz

# --- the manifest parser ---------------------------------------------------------------------


def _valid_manifest() -> dict[str, Any]:
    files = (
        FileEntry(path="gguf-q4_k_m/model.gguf", size=10, sha256="a" * 64),
        FileEntry(path="openvino-int4/openvino_model.xml", size=5, sha256="b" * 64),
    )
    variants = (
        Variant(
            name="gguf-q4_k_m",
            target="llamacpp",
            format="gguf",
            quant="Q4_K_M",
            recipe={"weights": "Q4_K_M", "kv_cache": "f16"},
            entry="gguf-q4_k_m/model.gguf",
            files=files[:1],
            runtime=RuntimeSettings(context=4096),
        ),
        Variant(
            name="openvino-int4",
            target="openvino",
            format="openvino",
            quant="INT4",
            recipe={},
            entry="openvino-int4",
            files=files[1:],
            runtime=RuntimeSettings(context=4096, device="GPU"),
        ),
    )
    manifest = Manifest(
        schema_version=1,
        name="b",
        model=ModelIdentity(
            name="m",
            family="llama",
            architecture="LlamaForCausalLM",
            parameters=134_515_008,
            context_length=8192,
            source=SourceModel(path="/models/m", format="hf", sha256="c" * 64),
        ),
        tokenizer=TokenizerInfo(kind="bpe-byte-level", chat_template="{{ x }}", eos_token="</s>"),
        variants=variants,
        provenance=Provenance(
            edgekit_version="0.1", created="2025-01-01T00:00:00+00:00", backends={}, host="h"
        ),
    )
    return json.loads(json.dumps(asdict(manifest)))


VALID = _valid_manifest()

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", "..", "/etc/passwd", "a/../b", "gguf-q4_k_m/model.gguf", "x\\y", "\0"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _assert_parses_or_refuses(text: str | bytes) -> None:
    try:
        manifest = parse_manifest(text, "fuzz/manifest.json")
    except BundleError:
        return
    # Accepted: everything a reader of the manifest relies on holds.
    assert manifest.variants
    seen: set[str] = set()
    for v in manifest.variants:
        paths = [f.path for f in v.files]
        for p in paths:
            split_relative(p)  # raises for anything unsafe
            assert p not in seen
            seen.add(p)
        split_relative(v.entry)
        assert v.entry in paths or any(p.startswith(v.entry + "/") for p in paths)
        assert all(f.size >= 0 for f in v.files)


@given(json_values)
def test_any_json_document(value: Any) -> None:
    _assert_parses_or_refuses(json.dumps(value))


@given(st.data())
def test_valid_manifest_with_one_part_changed(data: st.DataObject) -> None:
    doc = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        path = data.draw(st.sampled_from(_paths(doc)), label="path")
        action = data.draw(st.sampled_from(["replace", "drop", "add"]), label="action")
        if not path:
            doc = data.draw(json_values, label="document")
            continue
        *head, last = path
        parent: Any = doc
        for key in head:
            parent = parent[key]
        if action == "replace":
            parent[last] = data.draw(json_values, label="value")
        elif action == "drop":
            del parent[last]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=12), label="key")] = data.draw(json_values)
        else:
            parent.append(data.draw(json_values, label="item"))
    _assert_parses_or_refuses(json.dumps(doc))


@given(st.data())
def test_valid_manifest_bytes_flipped_or_cut(data: st.DataObject) -> None:
    raw = bytearray(json.dumps(VALID, indent=1).encode())
    for _ in range(data.draw(st.integers(0, 4), label="flips")):
        i = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[i] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    _assert_parses_or_refuses(bytes(raw[:cut] if data.draw(st.booleans()) else raw))


# --- the archive extractor -------------------------------------------------------------------

KINDS = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "blk": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
    "contiguous": tarfile.CONTTYPE,
    "unknown": b"Z",
}
segment = st.sampled_from(
    [
        "b",
        "b",
        "b",
        "x",
        "model.gguf",
        "sub",
        "..",
        ".",
        "",
        "d" * 247,
        "\x1b[2J",
        "é",
        "C:",
        "a\\b",
    ]
)
names = st.builds(
    lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
    st.sampled_from([False, False, False, True]),
    st.lists(segment, min_size=1, max_size=5),
)
members = st.lists(
    st.tuples(
        st.sampled_from(sorted(KINDS)),
        names,
        st.binary(max_size=1500),
        st.sampled_from(["b/x", "../../outside", "/etc/passwd", "b/model.gguf", "nothing", "b"]),
    ),
    min_size=1,
    max_size=10,
)
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def _build(spec: list[tuple[str, str, bytes, str]], fmt: int) -> bytes:
    buf = io.BytesIO()
    try:
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for kind, name, data, target in spec:
                info = tarfile.TarInfo(name)
                info.type = KINDS[kind]
                if kind in ("file", "contiguous", "unknown"):
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                    continue
                info.linkname = target
                info.devmajor, info.devminor = 1, 3
                tar.addfile(info)
    except (ValueError, UnicodeError, tarfile.HeaderError):
        reject()  # tarfile cannot write that name in that format
    return buf.getvalue()


def _tree(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            rel = p.relative_to(root).as_posix()
            if stat.S_ISDIR(mode):
                out[rel] = "dir"
            elif stat.S_ISREG(mode):
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = f"other {mode:o}"
    return out


def _expected_by_tarfile(archive: Path) -> dict[str, str]:
    """What Python's tarfile reads from an archive edgekit accepted: the same members."""
    out: dict[str, str] = {}
    with tarfile.open(archive, "r:") as tar:
        for m in tar.getmembers():
            if m.isdir():
                out[m.name.rstrip("/")] = "dir"
                parts = m.name.rstrip("/").split("/")
            else:
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = hashlib.sha256(f.read()).hexdigest()
                parts = m.name.split("/")
            for i in range(1, len(parts)):
                out.setdefault("/".join(parts[:i]), "dir")
    return out


@given(
    members,
    st.sampled_from(sorted(FORMATS)),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), max_size=3),
    st.none() | st.integers(0, 1 << 20),
)
def test_generated_archives(
    spec: list[tuple[str, str, bytes, str]],
    fmt: str,
    flips: list[tuple[int, int]],
    cut: int | None,
) -> None:
    raw = bytearray(_build(spec, FORMATS[fmt]))
    for at, xor in flips:
        raw[at % len(raw)] ^= xor
    if cut is not None:
        raw = raw[: cut % (len(raw) + 1)]
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        (base / "outside").mkdir()
        (base / "outside" / "victim").write_bytes(b"original")
        archive = base / "a.tar"
        archive.write_bytes(bytes(raw))
        out = base / "root"
        try:
            top = extract_archive(archive, out)
        except BundleError:
            assert not os.path.lexists(out), "a refused archive left files behind"
        else:
            tree = _tree(out)
            assert not [k for k, v in tree.items() if v.startswith("other")], tree
            assert top.parent == out and top.is_dir() and not top.is_symlink()
            assert tree == _expected_by_tarfile(archive)
        assert sorted(p.name for p in base.iterdir()) == sorted(
            ["outside", "a.tar", *(["root"] if out.exists() else [])]
        )
        assert [p.name for p in (base / "outside").iterdir()] == ["victim"]
        assert (base / "outside" / "victim").read_bytes() == b"original"
