"""A GGUF writer with every byte under the test's control: any value type for any key,
duplicate keys, nested arrays, wrong counts, misaligned or overlapping tensor offsets.

``tests/builders.py`` writes well-formed files; this module writes the hostile ones, and
the fuzz tests mutate its output. Value types are GGUF's own ids.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)

_SCALAR = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}


@dataclass(frozen=True)
class Value:
    """A typed metadata value. ``item`` is the element type of an array (``ARRAY``), and
    for an array of arrays ``value`` is a list of ``Value``s."""

    type: int
    value: Any
    item: int | None = None


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


@dataclass(frozen=True)
class Raw:
    """A value given as its bytes (after the type id): for shapes ``Value`` cannot build
    without recursing, such as arrays nested 50,000 deep."""

    type: int
    payload: bytes


def nested_arrays(depth: int) -> Raw:
    """An array of an array of ... (``depth`` levels) of an empty u8 array."""
    return Raw(ARRAY, struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", U8, 0))


def encode(v: Value | Raw) -> bytes:
    """The bytes of a value, without its type id."""
    if isinstance(v, Raw):
        return v.payload
    if v.type in _SCALAR:
        return struct.pack(_SCALAR[v.type], v.value)
    if v.type == STRING:
        return string(v.value)
    if v.type == ARRAY:
        assert v.item is not None
        items = v.value
        body = b"".join(
            encode(x) if isinstance(x, Value) else encode(Value(v.item, x)) for x in items
        )
        return struct.pack("<IQ", v.item, len(items)) + body
    raise ValueError(f"unknown GGUF type {v.type}")


def kv(key: str | bytes, v: Value | Raw) -> bytes:
    return string(key) + struct.pack("<I", v.type) + encode(v)


@dataclass
class Tensor:
    name: str | bytes
    shape: tuple[int, ...]  # PyTorch order (outermost first); written innermost first
    type_id: int = 0  # F32
    offset: int | None = None  # None: packed after the previous tensor, aligned
    nbytes: int | None = None  # bytes reserved in the data region (None: from shape/type)


_ELEMENT = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2)}


def tensor_nbytes(t: Tensor) -> int:
    block, size = _ELEMENT[t.type_id]
    n = 1
    for d in t.shape:
        n *= d
    return n // block * size


@dataclass
class GGUF:
    """A GGUF file as a list of key/value pairs (repeats allowed) and tensors."""

    metadata: list[tuple[str | bytes, Value | Raw]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    n_tensors: int | None = None  # None: the real count
    n_kv: int | None = None
    alignment: int = 32  # the data section's alignment used when packing
    data_size: int | None = None  # None: exactly what the tensors need

    def set(self, key: str, v: Value | Raw) -> GGUF:
        """Replace every pair of ``key`` (or append it)."""
        self.metadata = [(k, x) for k, x in self.metadata if k != key] + [(key, v)]
        return self

    def drop(self, key: str) -> GGUF:
        self.metadata = [(k, x) for k, x in self.metadata if k != key]
        return self

    def to_bytes(self) -> bytes:
        out = b"GGUF" + struct.pack(
            "<IQQ",
            self.version,
            len(self.tensors) if self.n_tensors is None else self.n_tensors,
            len(self.metadata) if self.n_kv is None else self.n_kv,
        )
        out += b"".join(kv(k, v) for k, v in self.metadata)
        offset, end = 0, 0
        for t in self.tensors:
            dims = list(reversed(t.shape))
            at = offset if t.offset is None else t.offset
            out += string(t.name) + struct.pack("<I", len(dims))
            out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", t.type_id, at)
            n = tensor_nbytes(t) if t.nbytes is None else t.nbytes
            end = max(end, at + n)
            offset = at + n + (-(at + n) % self.alignment)
        out += b"\x00" * (-len(out) % self.alignment)
        return out + bytes(end if self.data_size is None else self.data_size)


def tiny(arch: str = "llama", *, layers: int = 1) -> GGUF:
    """A small, complete and valid GGUF: hidden 64, 4 heads of 16, 2 KV heads, FFN 128,
    vocabulary 8, ``layers`` blocks with every tensor of a Llama block."""
    g = GGUF()
    for key, v in (
        ("general.architecture", Value(STRING, arch)),
        ("general.name", Value(STRING, "tiny")),
        ("general.file_type", Value(U32, 0)),
        (f"{arch}.context_length", Value(U32, 2048)),
        (f"{arch}.embedding_length", Value(U32, 64)),
        (f"{arch}.block_count", Value(U32, layers)),
        (f"{arch}.feed_forward_length", Value(U32, 128)),
        (f"{arch}.attention.head_count", Value(U32, 4)),
        (f"{arch}.attention.head_count_kv", Value(U32, 2)),
        (f"{arch}.attention.layer_norm_rms_epsilon", Value(F32, 1e-5)),
        ("tokenizer.ggml.model", Value(STRING, "gpt2")),
        ("tokenizer.ggml.tokens", Value(ARRAY, [f"t{i}" for i in range(8)], STRING)),
        ("tokenizer.ggml.token_type", Value(ARRAY, [1] * 8, I32)),
        ("tokenizer.ggml.bos_token_id", Value(U32, 1)),
    ):
        g.metadata.append((key, v))
    g.tensors.append(Tensor("token_embd.weight", (8, 64)))
    for i in range(layers):
        for name, shape in (
            ("attn_norm.weight", (64,)),
            ("attn_q.weight", (64, 64)),
            ("attn_k.weight", (32, 64)),
            ("attn_v.weight", (32, 64)),
            ("attn_output.weight", (64, 64)),
            ("ffn_norm.weight", (64,)),
            ("ffn_gate.weight", (128, 64)),
            ("ffn_up.weight", (128, 64)),
            ("ffn_down.weight", (64, 128)),
        ):
            g.tensors.append(Tensor(f"blk.{i}.{name}", shape))
    g.tensors.append(Tensor("output_norm.weight", (64,)))
    return g
