"""Property-based fuzzing of the model and profile readers.

Property: any input gives a valid ModelSpec / DeviceProfile or an edgekit error
(ModelError / ProfileError), never another exception, within a bounded time and memory.

Inputs: valid GGUF files (tests/raw_gguf.py and tests/builders.py) with bytes flipped,
spliced, truncated, or counts and lengths overwritten; GGUF files built from random
keys and values of every type (nested arrays included) and random tensors; safetensors
headers with random JSON in their entries; config.json with random values for every
structural key; profile TOML with random figures and edited lines.

The CI run is bounded (tests/conftest.py: 150 examples a test); EDGEKIT_FUZZ_EXAMPLES
raises it (see docs/fuzzing.md).
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hypothesis")

from hypothesis import example, given
from hypothesis import strategies as st

from edgekit.architectures import dimensions_from_config, expected_tensors, family_for_hf
from edgekit.devices import DeviceProfile, parse_profile
from edgekit.errors import ModelError, ProfileError
from edgekit.gguf_header import read_gguf_header
from edgekit.inspection import inspect_model, spec_from_gguf
from edgekit.modelspec import ModelSpec
from tests import raw_gguf as rg
from tests.builders import (
    FAMILY_CONFIGS,
    gguf_bytes,
    safetensors_bytes,
    tiny_config,
    tiny_gguf_metadata,
    tiny_gguf_tensors,
)
from tests.test_hostile_profiles import BASE as PROFILE

pytestmark = pytest.mark.fuzz

MAX_SECONDS = 3.0
MAX_PEAK = 64 << 20


@contextmanager
def bounded() -> Iterator[None]:
    """The body must finish within MAX_SECONDS and allocate at most MAX_PEAK."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"took {elapsed:.2f} s"
    assert peak < MAX_PEAK, f"allocated {peak / 2**20:.0f} MiB"


def inspect_or_model_error(path: Path) -> ModelSpec | None:
    with bounded():
        try:
            spec = inspect_model(path)
        except ModelError as exc:
            assert exc.message and exc.hint is not None
            return None
    # A spec that is returned is valid by construction; check the invariants anyway.
    assert 1 <= spec.layers <= 1024 and spec.heads % spec.kv_heads == 0
    assert spec.parameters >= 0 and spec.weight_bytes >= 0
    return spec


# --- GGUF: mutated valid files -------------------------------------------------------------

SEEDS = [
    rg.tiny(layers=1).to_bytes(),
    rg.tiny(layers=2).to_bytes(),
    rg.tiny("qwen2", layers=1).to_bytes(),
    gguf_bytes(tiny_gguf_metadata(), tiny_gguf_tensors()),
]
# Values that break readers: zero, one, all ones, powers of two at the type limits.
BOUNDARY = [0, 1, 2, 3, 7, 8, 255, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]


@st.composite
def mutated_gguf(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "u32", "u64", "truncate", "splice", "insert"]))
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind in ("u32", "u64"):
            fmt, width = ("<I", 4) if kind == "u32" else ("<Q", 8)
            value = draw(st.sampled_from(BOUNDARY)) % (1 << (8 * width))
            data[at : at + width] = struct.pack(fmt, value)
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            end = draw(st.integers(at, len(data)))
            data[at:end] = draw(st.binary(max_size=64))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


@example(SEEDS[0][:-1])
@example(SEEDS[0][:24] + struct.pack("<Q", 2**63) + SEEDS[0][32:])
@given(mutated_gguf())
def test_fuzz_gguf_mutations(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(data)
        inspect_or_model_error(path)
        # The converters read the arrays too (gguf_to_hf).
        with bounded(), suppress(ModelError):
            spec_from_gguf(read_gguf_header(path, keep_arrays=True))


# --- GGUF: random keys, value types and tensors --------------------------------------------

_SCALAR_VALUES: dict[int, st.SearchStrategy[Any]] = {
    rg.U8: st.integers(0, 255),
    rg.I8: st.integers(-128, 127),
    rg.U16: st.integers(0, 2**16 - 1),
    rg.I16: st.integers(-(2**15), 2**15 - 1),
    rg.U32: st.one_of(st.sampled_from(BOUNDARY[:11]), st.integers(0, 2**32 - 1)),
    rg.I32: st.integers(-(2**31), 2**31 - 1),
    rg.F32: st.floats(width=32),
    rg.BOOL: st.booleans(),
    rg.U64: st.one_of(st.sampled_from(BOUNDARY), st.integers(0, 2**64 - 1)),
    rg.I64: st.integers(-(2**63), 2**63 - 1),
    rg.F64: st.floats(),
    rg.STRING: st.text(max_size=16),
}


def _value(depth: int = 0) -> st.SearchStrategy[rg.Value]:
    scalar = st.sampled_from(sorted(_SCALAR_VALUES)).flatmap(
        lambda t: _SCALAR_VALUES[t].map(lambda v: rg.Value(t, v))
    )
    if depth >= 3:
        return scalar
    array = st.sampled_from(sorted(_SCALAR_VALUES)).flatmap(
        lambda t: st.lists(_SCALAR_VALUES[t], max_size=6).map(lambda vs: rg.Value(rg.ARRAY, vs, t))
    )
    nested = st.lists(_value(depth + 1), max_size=3).map(
        lambda vs: rg.Value(rg.ARRAY, vs, rg.ARRAY)
    )
    return st.one_of(scalar, array, nested)


# Keys edgekit and llama.cpp read, so the random values land where they matter.
_KEYS = [
    "general.architecture",
    "general.name",
    "general.alignment",
    "general.file_type",
    "llama.context_length",
    "llama.embedding_length",
    "llama.block_count",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.attention.sliding_window",
    "llama.vocab_size",
    "llama.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.chat_template",
]


@st.composite
def random_gguf(draw: st.DrawFn) -> bytes:
    g = rg.tiny(layers=draw(st.integers(1, 2)))
    for _ in range(draw(st.integers(1, 5))):
        key = draw(st.one_of(st.sampled_from(_KEYS), st.text(min_size=1, max_size=12)))
        g.set(key, draw(_value()))
    if draw(st.booleans()):
        g.tensors = [
            rg.Tensor(
                draw(st.sampled_from(["token_embd.weight", "blk.0.attn_q.weight", "blk.1.x"])),
                tuple(draw(st.lists(st.integers(1, 80), min_size=1, max_size=3))),
                draw(st.sampled_from([0, 1, 2, 8, 30])),
            )
            for _ in range(draw(st.integers(0, 4)))
        ]
    return g.to_bytes()


@given(random_gguf())
def test_fuzz_gguf_random_metadata(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(data)
        inspect_or_model_error(path)


# --- safetensors headers and config.json ---------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _base_tensors(family: str = "llama") -> dict[str, tuple[tuple[int, ...], str]]:
    config = tiny_config(family)
    fam = family_for_hf(config["model_type"])
    dims = dimensions_from_config(config, fam, "fuzz")
    return {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}


def _folder(tmp: str, config: Any, st_file: bytes | None) -> Path:
    folder = Path(tmp) / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        config if isinstance(config, str) else json.dumps(config, allow_nan=True)
    )
    if st_file is not None:
        (folder / "model.safetensors").write_bytes(st_file)
    return folder


@st.composite
def mutated_header(draw: st.DrawFn) -> bytes:
    raw = safetensors_bytes(_base_tensors())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    names = [k for k in header if k != "__metadata__"]
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from([*names, "__metadata__", "extra.weight"]))
        what = draw(st.sampled_from(["entry", "dtype", "shape", "data_offsets", "delete"]))
        if what == "delete":
            header.pop(name, None)
        elif what == "entry":
            header[name] = draw(json_values)
        else:
            entry = header.get(name)
            entry = dict(entry) if isinstance(entry, dict) else {}
            entry[what] = draw(
                st.one_of(
                    json_values,
                    st.lists(st.integers(-5, 2**20), max_size=3),
                    st.sampled_from(["F16", "BF16", "F32", "I8", "BOOL", "Q4"]),
                )
            )
            header[name] = entry
    blob = json.dumps(header).encode()
    length = draw(st.one_of(st.just(len(blob)), st.sampled_from(BOUNDARY)))
    keep = draw(st.integers(0, len(data)))
    return struct.pack("<Q", length % 2**64) + blob + data[:keep]


@given(mutated_header())
def test_fuzz_safetensors_header(st_file: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inspect_or_model_error(_folder(tmp, tiny_config("llama"), st_file))


_STRUCTURAL = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    "use_sliding_window",
    "tie_word_embeddings",
    "model_type",
    "architectures",
    "text_config",
    "quantization_config",
    "_name_or_path",
    "torch_dtype",
]
numbers = st.one_of(
    st.integers(-4, 300),
    st.sampled_from(BOUNDARY + [10**9, 10**15, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def random_config(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    family = draw(st.sampled_from(sorted(FAMILY_CONFIGS)))
    config = tiny_config(family)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(_STRUCTURAL))
        if draw(st.booleans()):
            config[key] = draw(st.one_of(numbers, json_values))
        else:
            config.pop(key, None)
    return config, family


@example((tiny_config("llama", num_hidden_layers=10**9), "llama"), False)
@given(random_config(), st.booleans())
def test_fuzz_config(config_family: tuple[dict[str, Any], str], weights: bool) -> None:
    config, family = config_family
    st_file = safetensors_bytes(_base_tensors(family)) if weights else None
    with tempfile.TemporaryDirectory() as tmp:
        spec = inspect_or_model_error(_folder(tmp, config, st_file))
    if spec is not None and spec.parameters_source == "config":
        assert len(spec.tensors) <= 16 * spec.layers + 3


# --- profile TOML ---------------------------------------------------------------------------

_FIGURE_LINES = [
    line
    for line in PROFILE.splitlines()
    if "=" in line and line.split("=")[1].strip()[0] in "-0123456789"
]
toml_numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: (
            "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf") if math.isinf(f) else repr(f)
        )
    ),
    st.sampled_from(["0", "-0.0", "1e400", "true", '"12"', "[1]", "{a=1}", "[[[[1]]]]"]),
)


@st.composite
def mutated_profile(draw: st.DrawFn) -> str:
    lines = PROFILE.splitlines()
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["figure", "delete", "duplicate", "insert", "garble"]))
        i = draw(st.integers(0, len(lines) - 1))
        if kind == "figure":
            line = draw(st.sampled_from(_FIGURE_LINES))
            i = lines.index(line) if line in lines else i
            key = lines[i].split("=")[0] if "=" in lines[i] else "x "
            lines[i] = f"{key}= {draw(toml_numbers)}"
        elif kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "insert":
            lines.insert(
                i,
                draw(
                    st.sampled_from(
                        [
                            "[[power.modes]]",
                            "[cpu]",
                            "[memory]",
                            "x = 1",
                            "[[accelerators]]",
                            'kind = "gpu"',
                        ]
                    )
                ),
            )
        else:
            lines[i] = draw(st.text(max_size=20))
        if not lines:
            break
    return "\n".join(lines) + "\n"


@example(PROFILE.replace("bandwidth_gbps = 100.0", "bandwidth_gbps = nan"))
@given(mutated_profile())
def test_fuzz_profile(text: str) -> None:
    with bounded():
        try:
            profile = parse_profile(text, "fuzz.toml")
        except ProfileError as exc:
            assert exc.message
            return
    _assert_sane(profile)


def _assert_sane(p: DeviceProfile) -> None:
    numbers: list[float] = [
        p.memory.total_gib,
        p.memory.usable_gib,
        p.power.idle_w,
        p.power.typical_w,
        p.power.max_w,
        *(m.compute_scale for m in p.power.modes),
        *(m.max_w for m in p.power.modes),
        *(v for a in p.accelerators for v in a.peak_tops.values()),
    ]
    if p.memory.bandwidth_gbps is not None:
        numbers.append(p.memory.bandwidth_gbps)
    assert all(math.isfinite(x) and x > 0 for x in numbers), numbers
    assert 1 <= p.cpu.physical_cores <= p.cpu.logical_cores
