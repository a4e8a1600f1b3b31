"""Hostile model files: a tiny config.json, GGUF or safetensors header that claims an
implausible structure, a hostile shard index, links out of the model folder.

Each case must end in a specific edgekit error with a useful message, quickly and in
bounded memory, without opening a file outside the model folder and without writing
anything; through the CLI, with exit code 1 and no traceback.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.architectures import dimensions_from_config, expected_tensors, family_for_hf
from edgekit.cli import main
from edgekit.errors import (
    EdgekitError,
    ModelFormatError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from edgekit.inspection import inspect_model
from tests import raw_gguf as rg
from tests.builders import safetensors_bytes, tiny_config

# Bounds every case must stay within (the slowest real header, a 7B's, takes ~50 ms).
MAX_SECONDS = 5.0
MAX_PEAK = 32 << 20
DELETE = object()

# --- what the code opened: an audit hook, gated so that it only records inside a case --

_OPENED: list[str] = []
_RECORDING = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _RECORDING[0] and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def _opened_outside(folder: Path, tmp: Path) -> list[str]:
    """Files opened under ``tmp`` but outside the model ``folder``, and /etc files."""
    folder = Path(os.path.realpath(os.fspath(folder).replace("\x00", "")))
    inside = folder if folder.is_dir() else folder.parent
    bad = []
    for name in _OPENED:
        p = Path(os.path.abspath(name))
        in_tmp = p.is_relative_to(tmp.resolve())
        if str(p).startswith("/etc/") or (in_tmp and not p.is_relative_to(inside)):
            bad.append(name)
    return bad


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


# --- a valid tiny Hugging Face folder, and edits of it -----------------------------------

BASE = tiny_config("llama")  # hidden 64, 2 layers, 4 heads / 2 KV heads, FFN 128, vocab 256


def base_tensors(config: dict[str, Any] = BASE) -> dict[str, tuple[tuple[int, ...], str]]:
    fam = family_for_hf(config["model_type"])
    dims = dimensions_from_config(config, fam, "base")
    return {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}


def hf(
    root: Path,
    *,
    config: dict[str, Any] | None = None,
    tensors: dict[str, tuple[tuple[int, ...], str]] | None = None,
    weights: bool = True,
) -> Path:
    folder = root / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(BASE if config is None else config))
    if weights:
        (folder / "model.safetensors").write_bytes(
            safetensors_bytes(base_tensors() if tensors is None else tensors)
        )
    return folder


def edited(**edits: Any) -> dict[str, Any]:
    config = dict(BASE)
    for k, v in edits.items():
        if v is DELETE:
            config.pop(k, None)
        else:
            config[k] = v
    return config


def rewrite_header(folder: Path, mutate: Callable[[dict[str, Any]], Any], extra: int = 0) -> None:
    """Replace model.safetensors' JSON header by ``mutate(header)`` (a dict or raw bytes),
    keeping the data section (plus ``extra`` zero bytes)."""
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = mutate(header)
    blob = out if isinstance(out, bytes) else json.dumps(out).encode()
    f.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :] + bytes(extra))


def write_index(folder: Path, index: Any) -> None:
    text = index if isinstance(index, str | bytes) else json.dumps(index)
    p = folder / "model.safetensors.index.json"
    p.write_bytes(text.encode() if isinstance(text, str) else text)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- the case table ----------------------------------------------------------------------

Case = tuple[Callable[[Path], Path], type[EdgekitError], str]
CASES: dict[str, Case] = {}


def case(name: str, error: type[EdgekitError], fragment: str) -> Callable[[Any], Any]:
    def register(make: Callable[[Path], Path]) -> Callable[[Path], Path]:
        assert name not in CASES, name
        CASES[name] = (make, error, fragment)
        return make

    return register


# config.json: implausible, mistyped or inconsistent numbers, in a folder with weights
# and in a config-only folder (described from the config: the path that hung).
CONFIG_EDITS: dict[str, tuple[dict[str, Any], str]] = {
    "layers-1e9": ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers"),
    "layers-2^63": ({"num_hidden_layers": 2**63}, "num_hidden_layers"),
    "layers-zero": ({"num_hidden_layers": 0}, "num_hidden_layers"),
    "layers-negative": ({"num_hidden_layers": -2}, "num_hidden_layers"),
    "layers-bool": ({"num_hidden_layers": True}, "num_hidden_layers"),
    "layers-float": ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
    "layers-string": ({"num_hidden_layers": "2"}, "num_hidden_layers"),
    "hidden-2^40": ({"hidden_size": 1 << 40}, "hidden_size"),
    "hidden-float": ({"hidden_size": 64.5}, "hidden_size"),
    "ffn-1e12": ({"intermediate_size": 10**12}, "intermediate_size"),
    "ffn-zero": ({"intermediate_size": 0}, "intermediate_size"),
    "vocab-1e10": ({"vocab_size": 10**10}, "vocab_size"),
    "vocab-negative": ({"vocab_size": -256}, "vocab_size"),
    "heads-do-not-divide-hidden": ({"num_attention_heads": 7}, "num_attention_heads"),
    "heads-zero": ({"num_attention_heads": 0}, "num_attention_heads"),
    "heads-1e6": ({"num_attention_heads": 1_000_000}, "num_attention_heads"),
    "kv-heads-do-not-divide-heads": ({"num_key_value_heads": 3}, "num_key_value_heads"),
    "kv-heads-above-heads": ({"num_key_value_heads": 8}, "num_key_value_heads"),
    "kv-heads-negative": ({"num_key_value_heads": -1}, "num_key_value_heads"),
    "kv-heads-zero": ({"num_key_value_heads": 0}, "num_key_value_heads"),
    "kv-heads-float": ({"num_key_value_heads": 2.0}, "num_key_value_heads"),
    "head-dim-zero": ({"head_dim": 0}, "head_dim"),
    "head-dim-negative": ({"head_dim": -16}, "head_dim"),
    "head-dim-float": ({"head_dim": 1.5}, "head_dim"),
    "head-dim-1e9": ({"head_dim": 10**9}, "head_dim"),
    "context-1e15": ({"max_position_embeddings": 10**15}, "max_position_embeddings"),
    "context-zero": ({"max_position_embeddings": 0}, "max_position_embeddings"),
    "context-missing": ({"max_position_embeddings": DELETE}, "max_position_embeddings"),
    "window-negative": ({"sliding_window": -1}, "sliding_window"),
    "window-bool": ({"sliding_window": True}, "sliding_window"),
    "window-1e12": ({"sliding_window": 10**12}, "sliding_window"),
    "tied-string": ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    "text-config-list": ({"text_config": [1, 2]}, "text_config"),
    "model-type-list": ({"model_type": ["llama"]}, "model_type"),
    "model-type-dict": ({"model_type": {"a": 1}}, "model_type"),
}

for _name, (_edits, _fragment) in CONFIG_EDITS.items():
    for _weights in (True, False):

        def _make(root: Path, edits: dict[str, Any] = _edits, weights: bool = _weights) -> Path:
            return hf(root, config=edited(**edits), weights=weights)

        case(
            f"config-{_name}-{'weights' if _weights else 'config-only'}",
            ModelFormatError,
            _fragment,
        )(_make)


@case("config-unsupported-with-odd-architectures", UnsupportedArchitectureError, "bert")
def _(root: Path) -> Path:
    return hf(root, config={"model_type": "bert", "architectures": 5})


@case("config-multimodal-text-config-1e9-layers", ModelFormatError, "num_hidden_layers")
def _(root: Path) -> Path:
    text = {k: v for k, v in tiny_config("gemma3").items() if k != "architectures"}
    text["num_hidden_layers"] = 10**9
    config = {"model_type": "gemma3", "architectures": ["X"], "text_config": text}
    return hf(root, config=config, weights=False)


def _config_bytes(root: Path, data: bytes) -> Path:
    folder = hf(root)
    (folder / "config.json").write_bytes(data)
    return folder


CONFIG_BYTES: dict[str, tuple[bytes, str]] = {
    "deep-nesting": (b'{"a": ' + nested(100_000).encode() + b"}", "nested"),
    "moderate-nesting": (b'{"a": ' + nested(200).encode() + b"}", "nested"),
    "huge": (b'{"pad": "' + b" " * (9 << 20) + b'"}', "larger than"),
    "repeated-key": (
        b'{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 1000000000}',
        "twice",
    ),
    "nan": (json.dumps(BASE)[:-1].encode() + b', "rope_theta": NaN}', "NaN"),
    "infinity-literal": (json.dumps(BASE)[:-1].encode() + b', "rope_theta": Infinity}', "Infinity"),
    "not-utf8": (b'{"model_type": "ll\xe4ma"}', "UTF-8"),
    "a-list": (b"[1, 2, 3]", "not a JSON object"),
    "empty": (b"", "JSON"),
}
for _name, (_data, _fragment) in CONFIG_BYTES.items():

    def _make_bytes(root: Path, data: bytes = _data) -> Path:
        return _config_bytes(root, data)

    case(f"config-bytes-{_name}", ModelFormatError, _fragment)(_make_bytes)


# --- safetensors headers ---


def _header_case(
    name: str, fragment: str, mutate: Callable[[dict[str, Any]], Any], extra: int = 0
) -> None:
    def make(root: Path) -> Path:
        folder = hf(root)
        rewrite_header(folder, mutate, extra)
        return folder

    case(f"safetensors-{name}", ModelFormatError, fragment)(make)


def _set(name: str, key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mutate(h: dict[str, Any]) -> dict[str, Any]:
        h[name] = {**h[name], key: value}
        return h

    return mutate


K = "model.layers.0.self_attn.k_proj.weight"
V = "model.layers.0.self_attn.v_proj.weight"
Q = "model.layers.0.self_attn.q_proj.weight"


def _overlap(h: dict[str, Any]) -> dict[str, Any]:
    h[V] = {**h[V], "data_offsets": h[K]["data_offsets"]}  # same size: bytes shared
    return h


def _gap(h: dict[str, Any]) -> dict[str, Any]:
    for name, e in h.items():
        if name != "__metadata__" and e["data_offsets"][0] > 0:
            e["data_offsets"] = [e["data_offsets"][0] + 64, e["data_offsets"][1] + 64]
    return h


def _repeat_key(h: dict[str, Any]) -> bytes:
    text = json.dumps(h)
    entry = json.dumps(h[K])
    return (text[:-1] + f', "{K}": {entry}}}').encode()


_header_case("overlapping-offsets", "overlap", _overlap)
_header_case("gap-between-tensors", "gap", _gap, extra=64)
_header_case("negative-begin", "data_offsets", _set(K, "data_offsets", [-8192, 0]))
_header_case("begin-after-end", "data_offsets", _set(K, "data_offsets", [8192, 4096]))
_header_case("float-offsets", "data_offsets", _set(K, "data_offsets", [0.0, 4096.0]))
_header_case("bool-offsets", "data_offsets", _set(K, "data_offsets", [False, True]))
_header_case("three-offsets", "data_offsets", _set(K, "data_offsets", [0, 4096, 8192]))
_header_case("negative-dims", "shape", _set(K, "shape", [-32, -64]))
_header_case("float-dims", "shape", _set(K, "shape", [32.0, 64.0]))
_header_case("string-shape", "shape", _set(K, "shape", "3264"))
_header_case("bool-dims", "shape", _set(K, "shape", [True, 2048]))
_header_case("sixty-dims", "shape", _set(K, "shape", [1] * 60 + [32, 64]))
_header_case("zero-size-tensor-for-a-weight", "shape", _set(K, "shape", [0, 64]))
_header_case("unknown-dtype", "dtype", _set(K, "dtype", "F128"))
_header_case("list-dtype", "dtype", _set(K, "dtype", ["BF16"]))
_header_case("entry-is-a-number", "entry", lambda h: {**h, K: 7})
_header_case(
    "entry-missing-offsets", "entry", lambda h: {**h, K: {"dtype": "BF16", "shape": [32, 64]}}
)
_header_case("metadata-not-strings", "__metadata__", lambda h: {**h, "__metadata__": {"a": 1}})
_header_case("metadata-a-list", "__metadata__", lambda h: {**h, "__metadata__": [1]})
_header_case(
    "deep-nesting",
    "nested",
    lambda h: json.dumps(h)[:-1].encode() + b', "x": ' + nested(50_000).encode() + b"}",
)
_header_case("nan", "NaN", lambda h: json.dumps(h)[:-1].encode() + b', "x": NaN}')
_header_case("repeated-tensor", "twice", _repeat_key)
_header_case("not-utf8", "UTF-8", lambda h: b'{"\xff": 1}')
_header_case("a-list", "not a JSON object", lambda h: b"[]")
_header_case("empty-header", "JSON", lambda h: b"")
_header_case("huge-header", "larger than", lambda h: b"{" + b" " * (40 << 20) + b"}")


@case("safetensors-no-tensors", ModelFormatError, "embed_tokens")
def _(root: Path) -> Path:
    folder = hf(root, weights=False)
    (folder / "model.safetensors").write_bytes(safetensors_bytes({}))
    return folder


# --- the tensor set against the config ---


def _tensor_case(name: str, fragment: str, edit: Callable[[dict[str, Any]], None]) -> None:
    def make(root: Path) -> Path:
        tensors = base_tensors()
        edit(tensors)
        return hf(root, tensors=tensors)

    case(f"tensors-{name}", ModelFormatError, fragment)(make)


def _drop_layer(t: dict[str, Any]) -> None:
    for n in [n for n in t if n.startswith("model.layers.1.")]:
        del t[n]


def _add_layer(t: dict[str, Any], index: int = 2) -> None:
    for n in [n for n in t if n.startswith("model.layers.1.")]:
        t[n.replace("layers.1.", f"layers.{index}.")] = t[n]


_tensor_case("missing-layer", "layer", _drop_layer)
_tensor_case("extra-layer", "layer", _add_layer)
_tensor_case("huge-layer-index", "layer", lambda t: _add_layer(t, 10**12))
_tensor_case("missing-q-proj", "q_proj", lambda t: t.pop("model.layers.1.self_attn.q_proj.weight"))
_tensor_case("q-proj-shape", "q_proj", lambda t: t.update({Q: ((32, 64), "BF16")}))
_tensor_case(
    "embedding-vocab",
    "embed_tokens",
    lambda t: t.update({"model.embed_tokens.weight": ((512, 64), "BF16")}),
)
_tensor_case("embedding-missing", "embed_tokens", lambda t: t.pop("model.embed_tokens.weight"))
_tensor_case(
    "lm-head-shape", "lm_head", lambda t: t.update({"lm_head.weight": ((256, 32), "BF16")})
)
_tensor_case("norm-shape", "model.norm", lambda t: t.update({"model.norm.weight": ((65,), "BF16")}))


def _sharded(
    root: Path,
    shards: list[dict[str, tuple[tuple[int, ...], str]]],
    weight_map: dict[str, str] | None = None,
) -> Path:
    folder = hf(root, weights=False)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    wm: dict[str, str] = {}
    for name, tensors in zip(names, shards, strict=True):
        (folder / name).write_bytes(safetensors_bytes(tensors))
        wm.update(dict.fromkeys(tensors, name))
    write_index(folder, {"metadata": {}, "weight_map": weight_map or wm})
    return folder


def _halves() -> tuple[dict[str, Any], dict[str, Any]]:
    t = base_tensors()
    names = list(t)
    return {n: t[n] for n in names[:10]}, {n: t[n] for n in names[10:]}


@case("shards-duplicate-tensor", ModelFormatError, "model.norm.weight")
def _(root: Path) -> Path:
    a, b = _halves()
    a["model.norm.weight"] = b["model.norm.weight"]
    return _sharded(root, [a, b])


@case("shards-index-names-the-wrong-shard", ModelFormatError, "index")
def _(root: Path) -> Path:
    a, b = _halves()
    wm = {
        **dict.fromkeys(a, "model-00002-of-00002.safetensors"),
        **dict.fromkeys(b, "model-00001-of-00002.safetensors"),
    }
    return _sharded(root, [a, b], wm)


@case("shards-tensor-not-in-index", ModelFormatError, "index")
def _(root: Path) -> Path:
    a, b = _halves()
    wm = {
        **dict.fromkeys(a, "model-00001-of-00002.safetensors"),
        **dict.fromkeys(b, "model-00002-of-00002.safetensors"),
    }
    del wm["model.norm.weight"]
    return _sharded(root, [a, b], wm)


@case("shards-index-tensor-in-no-shard", ModelFormatError, "index")
def _(root: Path) -> Path:
    a, b = _halves()
    wm = {
        **dict.fromkeys(a, "model-00001-of-00002.safetensors"),
        **dict.fromkeys(b, "model-00002-of-00002.safetensors"),
        "model.layers.7.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
    }
    return _sharded(root, [a, b], wm)


# --- hostile shard indexes and links out of the folder ---

OUTSIDE = "outside.safetensors"


def _outside(root: Path) -> Path:
    """A valid safetensors file beside (not in) the model folder: it must never be read."""
    root.mkdir(parents=True, exist_ok=True)
    f = root / OUTSIDE
    f.write_bytes(safetensors_bytes(base_tensors()))
    return f


def _index_case(
    name: str,
    fragment: str,
    weight_map: Callable[[Path], Any],
    prepare: Callable[[Path], None] = lambda folder: None,
) -> None:
    def make(root: Path) -> Path:
        outside = _outside(root)
        folder = hf(root, weights=False)
        prepare(folder)
        write_index(folder, {"weight_map": weight_map(outside)})
        return folder

    case(f"index-{name}", ModelFormatError, fragment)(make)


def _all_in(shard: str) -> Callable[[Path], dict[str, str]]:
    return lambda outside: dict.fromkeys(base_tensors(), shard)


NOT_IN_FOLDER = "not a .safetensors file in the model folder"
_index_case("dot-dot", NOT_IN_FOLDER, _all_in(f"../{OUTSIDE}"))
_index_case("etc-passwd", NOT_IN_FOLDER, _all_in("/etc/passwd"))
_index_case("absolute-outside", NOT_IN_FOLDER, lambda o: dict.fromkeys(base_tensors(), str(o)))
_index_case("dot-dot-only", NOT_IN_FOLDER, _all_in(".."))
_index_case("empty-name", NOT_IN_FOLDER, _all_in(""))
_index_case("nul-byte", NOT_IN_FOLDER, _all_in("model\x00.safetensors"))
_index_case("very-long-name", NOT_IN_FOLDER, _all_in("m" * 5000 + ".safetensors"))
_index_case("backslash", NOT_IN_FOLDER, _all_in("..\\outside.safetensors"))
_index_case("config-json", NOT_IN_FOLDER, _all_in("config.json"))
_index_case(
    "pickle-name",
    NOT_IN_FOLDER,
    _all_in("pytorch_model.bin"),
    lambda folder: (folder / "pytorch_model.bin").write_bytes(safetensors_bytes(base_tensors())),
)


def _subfolder(folder: Path) -> None:
    (folder / "sub").mkdir()
    (folder / "sub" / "model.safetensors").write_bytes(safetensors_bytes(base_tensors()))


_index_case("subfolder", NOT_IN_FOLDER, _all_in("sub/model.safetensors"), _subfolder)
_index_case(
    "symlink-out",
    "outside the model folder",
    _all_in("model.safetensors"),
    lambda folder: (folder / "model.safetensors").symlink_to(folder.parent / OUTSIDE),
)
_index_case(
    "symlink-to-etc",
    "outside the model folder",
    _all_in("model.safetensors"),
    lambda folder: (folder / "model.safetensors").symlink_to("/etc/passwd"),
)
_index_case(
    "fifo",
    "not a regular file",
    _all_in("model.safetensors"),
    lambda folder: os.mkfifo(folder / "model.safetensors"),
)
_index_case(
    "directory",
    "not a regular file",
    _all_in("model.safetensors"),
    lambda folder: (folder / "model.safetensors").mkdir(),
)
_index_case("weight-map-a-list", "weight_map", lambda o: ["model.safetensors"])
_index_case("weight-map-ints", "weight_map", lambda o: dict.fromkeys(base_tensors(), 1))
_index_case("weight-map-dicts", "weight_map", lambda o: dict.fromkeys(base_tensors(), {"a": "b"}))
_index_case("weight-map-null", "weight_map", lambda o: None)


def _index_bytes(name: str, fragment: str, data: bytes) -> None:
    def make(root: Path) -> Path:
        folder = hf(root)
        write_index(folder, data)
        return folder

    case(f"index-bytes-{name}", ModelFormatError, fragment)(make)


_index_bytes("not-json", "JSON", b"{weight_map")
_index_bytes(
    "deep-nesting", "nested", b'{"weight_map": {}, "x": ' + nested(100_000).encode() + b"}"
)
_index_bytes("repeated-key", "twice", b'{"weight_map": {}, "weight_map": {}}')
_index_bytes("a-list", "weight_map", b"[]")
_index_bytes("no-weight-map", "weight_map", b'{"metadata": {}}')
_index_bytes("huge", "larger than", b'{"weight_map": {}, "pad": "' + b" " * (40 << 20) + b'"}')


@case("index-is-a-link-out", ModelFormatError, "outside the model folder")
def _(root: Path) -> Path:
    outside = root / "index.json"
    root.mkdir(parents=True)
    outside.write_text(
        json.dumps({"weight_map": dict.fromkeys(base_tensors(), "model.safetensors")})
    )
    folder = hf(root)
    (folder / "model.safetensors.index.json").symlink_to(outside)
    return folder


@case("no-index-weights-link-out", ModelFormatError, "outside the model folder")
def _(root: Path) -> Path:
    outside = _outside(root)
    folder = hf(root, weights=False)
    (folder / "model.safetensors").symlink_to(outside)
    return folder


@case("no-index-fifo-beside-weights", ModelFormatError, "not a regular file")
def _(root: Path) -> Path:
    folder = hf(root)
    os.mkfifo(folder / "extra.safetensors")
    return folder


def _loop(folder: Path, name: str) -> None:
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(folder / "other")
    (folder / "other").symlink_to(folder / name)


@case("weights-link-loop", ModelFormatError, "loop")
def _(root: Path) -> Path:
    folder = hf(root)
    _loop(folder, "model.safetensors")
    return folder


@case("config-link-loop", ModelFormatError, "loop")
def _(root: Path) -> Path:
    folder = hf(root)
    _loop(folder, "config.json")
    return folder


@case("config-is-a-link-out", ModelFormatError, "outside the model folder")
def _(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "other-config.json").write_text(json.dumps(BASE))
    folder = hf(root)
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(root / "other-config.json")
    return folder


@case("tokenizer-json-link-to-dev-zero", ModelFormatError, "outside the model folder")
def _(root: Path) -> Path:
    folder = hf(root)
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    return folder


@case("tokenizer-config-deep-nesting", ModelFormatError, "nested")
def _(root: Path) -> Path:
    folder = hf(root)
    (folder / "tokenizer_config.json").write_text('{"a": ' + nested(100_000) + "}")
    return folder


@case("tokenizer-config-not-json", ModelFormatError, "tokenizer_config.json")
def _(root: Path) -> Path:
    folder = hf(root)
    (folder / "tokenizer_config.json").write_text("{chat_template")
    return folder


@case("tokenizer-config-a-list", ModelFormatError, "tokenizer_config.json")
def _(root: Path) -> Path:
    folder = hf(root)
    (folder / "tokenizer_config.json").write_text("[1]")
    return folder


@case("path-with-nul", ModelNotFoundError, "NUL")
def _(root: Path) -> Path:
    return Path(str(root / "model") + "\x00.gguf")


# --- GGUF ---


def _gguf_case(
    name: str,
    fragment: str,
    edit: Callable[[rg.GGUF], Any],
    layers: int = 1,
    error: type[EdgekitError] = ModelFormatError,
) -> None:
    def make(root: Path) -> Path:
        root.mkdir(parents=True)
        g = rg.tiny(layers=layers)
        edit(g)
        f = root / "model.gguf"
        f.write_bytes(g.to_bytes())
        return f

    case(f"gguf-{name}", error, fragment)(make)


def _meta(key: str, v: rg.Value) -> Callable[[rg.GGUF], Any]:
    return lambda g: g.set(key, v)


S, A = rg.STRING, rg.ARRAY
_gguf_case(
    "block-count-2^32-1", "block_count", _meta("llama.block_count", rg.Value(rg.U32, 2**32 - 1))
)
_gguf_case("block-count-zero", "block_count", _meta("llama.block_count", rg.Value(rg.U32, 0)))
_gguf_case("block-count-string", "block_count", _meta("llama.block_count", rg.Value(S, "1")))
_gguf_case("block-count-float", "block_count", _meta("llama.block_count", rg.Value(rg.F32, 1.0)))
_gguf_case("block-count-bool", "block_count", _meta("llama.block_count", rg.Value(rg.BOOL, True)))
_gguf_case("block-count-array", "block_count", _meta("llama.block_count", rg.Value(A, [1], rg.U32)))
_gguf_case("block-count-negative", "block_count", _meta("llama.block_count", rg.Value(rg.I32, -1)))
_gguf_case("block-count-2^63", "block_count", _meta("llama.block_count", rg.Value(rg.U64, 2**63)))
_gguf_case("context-string", "context_length", _meta("llama.context_length", rg.Value(S, "2048")))
_gguf_case("context-2^60", "context_length", _meta("llama.context_length", rg.Value(rg.U64, 2**60)))
_gguf_case(
    "embedding-2^40", "embedding_length", _meta("llama.embedding_length", rg.Value(rg.U64, 2**40))
)
_gguf_case(
    "ffn-zero", "feed_forward_length", _meta("llama.feed_forward_length", rg.Value(rg.U32, 0))
)
_gguf_case("heads-zero", "head_count", _meta("llama.attention.head_count", rg.Value(rg.U32, 0)))
_gguf_case(
    "heads-do-not-divide", "head_count", _meta("llama.attention.head_count", rg.Value(rg.U32, 5))
)
_gguf_case(
    "kv-heads-do-not-divide",
    "head_count_kv",
    _meta("llama.attention.head_count_kv", rg.Value(rg.U32, 3)),
)
_gguf_case(
    "kv-heads-above-heads",
    "head_count_kv",
    _meta("llama.attention.head_count_kv", rg.Value(rg.U32, 8)),
)
_gguf_case(
    "kv-heads-array-of-strings",
    "head_count_kv",
    _meta("llama.attention.head_count_kv", rg.Value(A, ["2"], S)),
)
_gguf_case(
    "kv-heads-array-negative",
    "head_count_kv",
    _meta("llama.attention.head_count_kv", rg.Value(A, [-1], rg.I32)),
)
_gguf_case(
    "kv-heads-array-wrong-length",
    "head_count_kv",
    _meta("llama.attention.head_count_kv", rg.Value(A, [2] * 5, rg.U32)),
)
_gguf_case(
    "key-length-zero", "key_length", _meta("llama.attention.key_length", rg.Value(rg.U32, 0))
)
_gguf_case(
    "key-length-2^31", "key_length", _meta("llama.attention.key_length", rg.Value(rg.U32, 2**31))
)
_gguf_case("vocab-size-string", "vocab_size", _meta("llama.vocab_size", rg.Value(S, "8")))
_gguf_case(
    "vocab-size-disagrees-with-tokens", "vocab", _meta("llama.vocab_size", rg.Value(rg.U32, 10))
)
_gguf_case(
    "architecture-u32", "general.architecture", _meta("general.architecture", rg.Value(rg.U32, 1))
)
_gguf_case(
    "architecture-array",
    "general.architecture",
    _meta("general.architecture", rg.Value(A, ["llama"], S)),
)
_gguf_case(
    "file-type-array", "general.file_type", _meta("general.file_type", rg.Value(A, [1], rg.U32))
)
_gguf_case("file-type-string", "general.file_type", _meta("general.file_type", rg.Value(S, "F16")))
_gguf_case("name-array", "general.name", _meta("general.name", rg.Value(A, ["a"], S)))
_gguf_case("alignment-zero", "alignment", _meta("general.alignment", rg.Value(rg.U32, 0)))
_gguf_case(
    "alignment-not-power-of-two", "alignment", _meta("general.alignment", rg.Value(rg.U32, 3))
)
_gguf_case("alignment-string", "alignment", _meta("general.alignment", rg.Value(S, "32")))
_gguf_case(
    "tokenizer-model-u32",
    "tokenizer.ggml.model",
    _meta("tokenizer.ggml.model", rg.Value(rg.U32, 2)),
)
_gguf_case(
    "tokenizer-model-array",
    "tokenizer.ggml.model",
    _meta("tokenizer.ggml.model", rg.Value(A, ["gpt2"], S)),
)
_gguf_case(
    "tokens-u32",
    "tokenizer.ggml.tokens",
    _meta("tokenizer.ggml.tokens", rg.Value(A, list(range(8)), rg.U32)),
)
_gguf_case(
    "tokens-a-string", "tokenizer.ggml.tokens", _meta("tokenizer.ggml.tokens", rg.Value(S, "t"))
)
_gguf_case(
    "tokens-arrays-of-strings",
    "tokenizer.ggml.tokens",
    _meta("tokenizer.ggml.tokens", rg.Value(A, [rg.Value(A, ["t"], S) for _ in range(8)], A)),
)
_gguf_case("tokens-empty", "vocab", _meta("tokenizer.ggml.tokens", rg.Value(A, [], S)))
_gguf_case(
    "no-vocabulary",
    "vocab",
    lambda g: g.drop("tokenizer.ggml.tokens").drop("tokenizer.ggml.token_type"),
)
_gguf_case(
    "chat-template-u32", "chat_template", _meta("tokenizer.chat_template", rg.Value(rg.U32, 1))
)
_gguf_case(
    "eps-string",
    "layer_norm_rms_epsilon",
    _meta("llama.attention.layer_norm_rms_epsilon", rg.Value(S, "1e-5")),
)
_gguf_case(
    "eps-nan",
    "layer_norm_rms_epsilon",
    _meta("llama.attention.layer_norm_rms_epsilon", rg.Value(rg.F32, float("nan"))),
)
_gguf_case("freq-base-string", "freq_base", _meta("llama.rope.freq_base", rg.Value(S, "1e4")))
_gguf_case("bos-string", "bos_token_id", _meta("tokenizer.ggml.bos_token_id", rg.Value(S, "1")))
_gguf_case(
    "add-bos-u32", "add_bos_token", _meta("tokenizer.ggml.add_bos_token", rg.Value(rg.U32, 1))
)
_gguf_case(
    "window-string", "sliding_window", _meta("llama.attention.sliding_window", rg.Value(S, "512"))
)
_gguf_case(
    "window-zero", "sliding_window", _meta("llama.attention.sliding_window", rg.Value(rg.U32, 0))
)


_gguf_case("arrays-nested-3-deep", "nested", _meta("x.deep", rg.nested_arrays(3)))
_gguf_case("arrays-nested-50000-deep", "nested", _meta("x.deep", rg.nested_arrays(50_000)))
_gguf_case("array-unknown-item-type", "type 99", _meta("x.odd", rg.Value(A, [], 99)))
_gguf_case("huge-key", "key", lambda g: g.metadata.append(("k" * (1 << 20), rg.Value(rg.U8, 1))))
_gguf_case(
    "duplicate-key",
    "twice",
    lambda g: g.metadata.append(("llama.block_count", rg.Value(rg.U32, 2**32 - 1))),
)


def _dup_tensor(g: rg.GGUF) -> None:
    g.tensors.append(rg.Tensor("blk.0.attn_q.weight", (64, 64)))


def _many_keys(g: rg.GGUF) -> None:
    g.n_kv = 1 << 20
    g.data_size = 16 << 20


def _many_tensors(g: rg.GGUF) -> None:
    g.n_tensors = 1 << 20
    g.data_size = 16 << 20


def _tensor(index: int, **changes: Any) -> Callable[[rg.GGUF], None]:
    def edit(g: rg.GGUF) -> None:
        for k, v in changes.items():
            setattr(g.tensors[index], k, v)

    return edit


_gguf_case("duplicate-tensor", "twice", _dup_tensor)
_gguf_case("too-many-keys", "metadata keys", _many_keys)
_gguf_case("too-many-tensors", "tensors", _many_tensors)
_gguf_case("five-dims", "dimensions", _tensor(1, shape=(1, 1, 1, 1, 64)))
_gguf_case("zero-dims", "dimensions", _tensor(1, shape=()))
_gguf_case("a-zero-dim", "dimension", _tensor(1, shape=(0, 64)))
_gguf_case("misaligned-offset", "aligned", _tensor(2, offset=33))
_gguf_case("overlapping-tensors", "overlap", _tensor(3, offset=0))
_gguf_case("long-tensor-name", "name", _tensor(1, name="blk.0." + "x" * 100))
_gguf_case("quant-rows-not-whole-blocks", "block", _tensor(2, shape=(64, 48), type_id=2))
_gguf_case(
    "extra-block", "blk.1", lambda g: g.tensors.append(rg.Tensor("blk.1.attn_norm.weight", (64,)))
)
_gguf_case(
    "huge-block-index",
    "blk.",
    lambda g: g.tensors.append(rg.Tensor("blk.99999999999999.attn_norm.weight", (64,))),
)
_gguf_case("embedding-hidden-mismatch", "token_embd", _tensor(0, shape=(8, 32)))
_gguf_case("embedding-vocab-mismatch", "token_embd", _tensor(0, shape=(16, 64)))
_gguf_case("attn-q-shape", "attn_q", _tensor(2, shape=(32, 64)))
_gguf_case("ffn-down-shape", "ffn_down", _tensor(9, shape=(128, 64)))
_gguf_case("no-tensors", "token_embd", lambda g: g.tensors.clear())


def _missing_block(root: Path) -> Path:
    root.mkdir(parents=True)
    g = rg.tiny(layers=1).set("llama.block_count", rg.Value(rg.U32, 2))
    f = root / "model.gguf"
    f.write_bytes(g.to_bytes())
    return f


CASES["gguf-missing-block"] = (_missing_block, ModelFormatError, "blk.1")


def _run_api(path: Path, tmp: Path) -> tuple[BaseException | None, float, int, list[str]]:
    _OPENED.clear()
    tracemalloc.start()
    _RECORDING[0] = True
    t0 = time.perf_counter()
    caught: BaseException | None = None
    try:
        inspect_model(path)
    except Exception as exc:  # the assertion below names the type
        caught = exc
    finally:
        elapsed = time.perf_counter() - t0
        _RECORDING[0] = False
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return caught, elapsed, peak, _opened_outside(path, tmp)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_model_api(tmp_path: Path, name: str) -> None:
    make, error, fragment = CASES[name]
    path = make(tmp_path / "work")
    before = _tree(tmp_path)
    caught, elapsed, peak, outside = _run_api(path, tmp_path)
    assert isinstance(caught, error), f"{type(caught).__name__}: {caught}"
    assert fragment in caught.message, caught.message
    assert caught.hint, "every error carries a hint"
    assert len(caught.message) < 2000, "a hostile name must not flood the message"
    assert elapsed < MAX_SECONDS, f"took {elapsed:.1f} s"
    assert peak < MAX_PEAK, f"allocated {peak / 2**20:.0f} MiB"
    assert not outside, f"opened outside the model folder: {outside}"
    assert _tree(tmp_path) == before, "inspection wrote something"


def _squash(text: str) -> str:
    return "".join(text.split())


def _cli(args: list[str]) -> Any:
    return CliRunner().invoke(main, args)


def _assert_clean_failure(result: Any, fragment: str) -> None:
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "error:" in result.output
    assert _squash(fragment) in _squash(result.output), result.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_model_cli_inspect(tmp_path: Path, name: str) -> None:
    make, _, fragment = CASES[name]
    path = make(tmp_path / "work")
    if "\x00" in str(path):
        pytest.skip("a NUL byte cannot pass through argv")
    before = _tree(tmp_path)
    t0 = time.perf_counter()
    result = _cli(["inspect", str(path)])
    assert time.perf_counter() - t0 < MAX_SECONDS * 2
    _assert_clean_failure(result, fragment)
    assert _tree(tmp_path) == before


# `edgekit plan` on a subset: the out-of-memory example and one of each kind.
PLAN_CASES = [
    "config-layers-1e9-config-only",
    "config-layers-1e9-weights",
    "config-heads-1e6-config-only",
    "config-bytes-deep-nesting",
    "safetensors-overlapping-offsets",
    "tensors-extra-layer",
    "index-dot-dot",
    "index-symlink-out",
    "gguf-block-count-2^32-1",
    "gguf-arrays-nested-50000-deep",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", PLAN_CASES)
def test_hostile_model_cli_plan(tmp_path: Path, name: str) -> None:
    make, _, fragment = CASES[name]
    path = make(tmp_path / "work")
    before = _tree(tmp_path)
    result = _cli(["plan", str(path), "--device", "x86-laptop-no-gpu"])
    _assert_clean_failure(result, fragment)
    assert _tree(tmp_path) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["gguf-block-count-2^32-1", "gguf-heads-do-not-divide"])
def test_hostile_gguf_cli_convert_to_hf_writes_nothing(tmp_path: Path, name: str) -> None:
    """The issue's 10 KB GGUF made `convert --to hf` allocate 7.6 GB: now refused first."""
    pytest.importorskip("gguf")
    make, _, fragment = CASES[name]
    path = make(tmp_path / "work")
    before = _tree(tmp_path)
    result = _cli(["convert", str(path), "--to", "hf", "-o", str(tmp_path / "work" / "out")])
    _assert_clean_failure(result, fragment)
    assert _tree(tmp_path) == before, "nothing (not even a partial folder) is written"


# --- what must keep working --------------------------------------------------------------


def test_hf_cache_snapshot_links_are_followed(tmp_path: Path) -> None:
    """huggingface_hub's cache links snapshots/REV/FILE to ../../blobs/HASH: allowed."""
    repo = tmp_path / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "1").write_text(json.dumps(BASE))
    (blobs / "2").write_bytes(safetensors_bytes(base_tensors()))
    (snap / "config.json").symlink_to("../../blobs/1")
    (snap / "model.safetensors").symlink_to("../../blobs/2")
    spec = inspect_model(snap)
    assert spec.layers == 2 and spec.parameters_source == "tensors"


def test_links_inside_the_folder_are_followed(tmp_path: Path) -> None:
    folder = hf(tmp_path)
    (folder / "model.safetensors").rename(folder / "weights.bin.safetensors")
    (folder / "model.safetensors").symlink_to("weights.bin.safetensors")
    write_index(folder, {"weight_map": dict.fromkeys(base_tensors(), "model.safetensors")})
    assert inspect_model(folder).layers == 2


@pytest.mark.parametrize(
    "edits",
    [
        {"head_dim": None, "num_key_value_heads": None, "sliding_window": None},
        {"tie_word_embeddings": None},
    ],
    ids=["nulls", "tied-null"],
)
def test_null_optional_keys_are_absent_keys(tmp_path: Path, edits: dict[str, Any]) -> None:
    config = edited(**edits)
    spec = inspect_model(hf(tmp_path, config=config, tensors=base_tensors(config)))
    assert spec.head_dim == 16 and spec.kv_heads == (2 if "num_key_value_heads" not in edits else 4)


def test_explicit_head_dim_need_not_divide_hidden(tmp_path: Path) -> None:
    """Gemma 3 270M: hidden 640, 4 heads of 256 (4 x 256 != 640) is a real model."""
    config = tiny_config("gemma3", hidden_size=42, head_dim=32)
    spec = inspect_model(hf(tmp_path, config=config, tensors=base_tensors(config)))
    assert (spec.hidden_size, spec.heads, spec.head_dim) == (42, 4, 32)


def test_unused_window_of_a_qwen2_config_is_ignored(tmp_path: Path) -> None:
    config = tiny_config("qwen2", sliding_window=131072, use_sliding_window=False)
    spec = inspect_model(hf(tmp_path, config=config, tensors=base_tensors(config)))
    assert spec.sliding_window is None


def test_extra_tensors_outside_the_layers_are_tolerated(tmp_path: Path) -> None:
    """Inspection describes what is there; converters refuse what they cannot map."""
    tensors = {**base_tensors(), "lora_A.weight": ((4, 4), "F32")}
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = ((8,), "F32")
    assert inspect_model(hf(tmp_path, tensors=tensors)).layers == 2


def test_tied_checkpoint_that_still_stores_lm_head(tmp_path: Path) -> None:
    config = edited(tie_word_embeddings=True)
    tensors = {**base_tensors(config), "lm_head.weight": ((256, 64), "BF16")}
    spec = inspect_model(hf(tmp_path, config=config, tensors=tensors))
    assert spec.tied_embeddings and spec.parameters == sum(
        t.numel for t in spec.tensors if t.name != "lm_head.weight"
    )


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model."])
def test_multimodal_gemma3_checkpoint_with_a_vision_tower(tmp_path: Path, prefix: str) -> None:
    text = {k: v for k, v in tiny_config("gemma3").items() if k != "architectures"}
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text,
    }
    lm = {prefix + n[len("model.") :]: v for n, v in base_tensors(tiny_config("gemma3")).items()}
    vision = {
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": ((8, 8), "BF16"),
        "vision_tower.vision_model.encoder.layers.5.mlp.fc1.weight": ((8, 8), "BF16"),
        "multi_modal_projector.mm_input_projection_weight": ((8, 64), "BF16"),
    }
    spec = inspect_model(hf(tmp_path, config=config, tensors={**lm, **vision}))
    assert spec.family == "gemma3" and spec.layers == 2


def test_valid_tiny_gguf_of_the_raw_writer_is_read(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(rg.tiny(layers=2).to_bytes())
    spec = inspect_model(f)
    assert (spec.layers, spec.hidden_size, spec.heads, spec.kv_heads, spec.vocab_size) == (
        2,
        64,
        4,
        2,
        8,
    )


def test_gguf_with_a_64_bit_block_count_is_read(tmp_path: Path) -> None:
    """The GGUF spec types the hyperparameters uint64; llama.cpp writes uint32: both are
    integers and both are read."""
    f = tmp_path / "tiny.gguf"
    f.write_bytes(rg.tiny().set("llama.block_count", rg.Value(rg.U64, 1)).to_bytes())
    assert inspect_model(f).layers == 1
