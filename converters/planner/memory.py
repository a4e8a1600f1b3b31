"""Memory a loaded model takes: weights x residency + KV cache + runtime buffers.

    weights   the variant's tensors (``Format.layout`` planned, ``Format.built_layout``
              of a built file) x the runtime's resident bytes per weight byte
    KV cache  2 (K and V) x KV heads x head dim x bytes per element, summed over layers of
              the positions each layer holds (below), x the runtime's copies and padding
    runtime   the target's buffers and libraries (``Coefficients.runtime_bytes``)

``resident_bytes`` is the one formula: the planner, pack's predicted figures, load's
admission check and calibration all call it. With several streams decoded together
(continuous batching: ``edgekit.load(parallel=N)``) every stream holds its own KV cache
of the context, and a row of logits (``stream_runtime_bytes``).

Positions per layer. A layer with full attention holds the whole context. A layer with a
sliding window (Gemma 3: five of every six layers attend to the last 512 or 1024 tokens)
needs only the window, but only a runtime that implements it allocates less: a target
says so in its ``KvCacheLayout`` (the families whose windowed layers it keeps at the
window, the padding of its cells, the positions a windowed layer holds beyond the
window). Every other target holds the whole context on every layer, window or not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.targets.contract import Coefficients, KvCacheLayout
from edgekit.targets.registry import all_targets

from edgekit.errors import ModelFormatError
from edgekit.gguf_header import read_gguf_header
from edgekit.modelspec import ModelSpec
from edgekit.untrusted import parse_json

# KV-cache type -> bytes per element (block types include their scales)
KV_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# Gemma 3's layout when the model says nothing: every sixth layer global (transformers'
# Gemma3TextConfig default; llama.cpp's load_swa_pattern(ml, 6) for gemma3).
DEFAULT_SWA_PATTERN = {"gemma3": 6}
_CONFIG_MAX_BYTES = 4 << 20  # a config.json is a few kilobytes


def resident_bytes(
    weights_bytes: int,
    kv_bytes: int,
    c: Coefficients,
    *,
    streams: int = 1,
    stream_bytes: int = 0,
) -> int:
    """Resident memory of a loaded model: weights x residency + KV x scale + runtime.

    ``streams`` generations decoded together (continuous batching) each hold a KV cache of
    ``kv_bytes`` (their own context) and, beyond the first, ``stream_bytes`` of runtime
    buffers (``stream_runtime_bytes``); one stream is the single-stream session."""
    kv = streams * kv_bytes * c.kv_scale
    extra = (streams - 1) * stream_bytes
    return int(weights_bytes * c.weight_residency + kv) + c.runtime_bytes + extra


def stream_runtime_bytes(spec: ModelSpec) -> int:
    """Runtime buffers each stream beyond the first adds: one f32 row of logits (vocabulary
    x 4 bytes) for the token it samples every step. A runtime's scratch buffers are sized
    by the tokens of one step (its micro-batch), not by the number of streams, so they are
    not counted again (a first estimate: no batched benchmark calibrates it yet)."""
    return spec.vocab_size * 4


def streams_that_fit(
    weights_bytes: int,
    kv_bytes: int,
    c: Coefficients,
    limit_bytes: int,
    *,
    stream_bytes: int,
    most: int,
) -> int:
    """The most streams, 0 to ``most``, whose resident memory (``resident_bytes``) is
    within ``limit_bytes``; 0: not even one."""
    fitting = 0
    for n in range(1, most + 1):
        need = resident_bytes(weights_bytes, kv_bytes, c, streams=n, stream_bytes=stream_bytes)
        if need > limit_bytes:
            break
        fitting = n
    return fitting


@dataclass(frozen=True, kw_only=True)
class AttentionLayers:
    """How many layers attend to the whole context and how many to a sliding window."""

    full: int
    windowed: int
    window: int | None  # tokens; None when no layer has a window

    def describe(self) -> str:
        if not self.windowed:
            return f"all {self.full} layers attend to the whole context"
        return (
            f"{self.windowed} of {self.full + self.windowed} layers attend to a "
            f"{self.window}-token sliding window"
        )


def windowed_families() -> frozenset[str]:
    """The families some registered target keeps a windowed KV cache for."""
    return frozenset().union(*(t.kv_cache.windowed_families for t in all_targets()))


def attention_layers(spec: ModelSpec) -> AttentionLayers:
    """Which layers of ``spec`` have a sliding window, from the model's own metadata:
    config.json's ``layer_types`` or ``sliding_window_pattern``, or the GGUF's
    ``{arch}.attention.sliding_window_pattern`` (what llama.cpp reads), else the family's
    default pattern. Only families whose windowed cache some target implements are looked
    up; for the others the pattern changes no prediction.

    Raises:
        ModelFormatError: the pattern in the model's metadata is malformed.
    """
    window = spec.sliding_window
    if not window or spec.family not in windowed_families():
        return AttentionLayers(full=spec.layers, windowed=0, window=None)
    windowed = sum(_pattern(spec))
    return AttentionLayers(full=spec.layers - windowed, windowed=windowed, window=window)


def kv_positions(
    spec: ModelSpec, tokens: int, layout: KvCacheLayout | None, *, allocated: bool = True
) -> tuple[int, int]:
    """(positions a full-attention layer holds, positions a windowed layer holds) when a
    runtime whose cache is ``layout`` runs ``spec`` with ``tokens`` in the context.
    ``allocated``: what the runtime allocates (its padding and the positions beyond the
    window included); otherwise the positions a decode step reads. ``layout=None``: every
    layer holds every token."""
    pad = layout.pad if allocated and layout is not None else 1
    full = _pad(tokens, pad)
    layers = attention_layers(spec)
    if layout is None or layers.window is None or spec.family not in layout.windowed_families:
        return full, full
    if allocated:
        return full, _pad(min(full, layers.window + layout.window_extra), pad)
    return full, min(full, layers.window)


def kv_cache_bytes(
    spec: ModelSpec,
    tokens: int,
    kv_cache: str = "f16",
    *,
    layout: KvCacheLayout | None = None,
    allocated: bool = True,
) -> int:
    """Bytes of the KV cache a runtime whose cache is ``layout`` holds for ``spec`` with
    ``tokens`` in the context (``allocated=False``: the bytes a decode step reads;
    ``layout=None``: every token on every layer)."""
    per_position = 2 * spec.kv_heads * spec.head_dim * KV_BYTES.get(kv_cache, 2.0)
    full, windowed = kv_positions(spec, tokens, layout, allocated=allocated)
    if full == windowed:
        return int(spec.layers * full * per_position)
    layers = attention_layers(spec)
    return int((layers.full * full + layers.windowed * windowed) * per_position)


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


# ---------------------------------------------------------------------------------------
# The per-layer pattern, read from the model's metadata (once per file version).


def _pattern(spec: ModelSpec) -> tuple[bool, ...]:
    path = Path(spec.path)
    try:
        st = path.stat()
    except OSError:  # a spec built in memory (tests, configs): the family's default
        return _from_period(DEFAULT_SWA_PATTERN.get(spec.family, 0), spec.layers)
    key = (str(path), st.st_mtime_ns, st.st_size)
    return _pattern_of_file(*key, spec.format, spec.architecture, spec.family, spec.layers)


@functools.lru_cache(maxsize=64)
def _pattern_of_file(
    path: str, _mtime: int, _size: int, fmt: str, arch: str, family: str, layers: int
) -> tuple[bool, ...]:
    if fmt == "gguf":
        value = read_gguf_header(path).get(f"{arch}.attention.sliding_window_pattern")
        where = f"{path}: {arch}.attention.sliding_window_pattern"
        if value is None:
            return _from_period(DEFAULT_SWA_PATTERN.get(family, 0), layers)
        return _checked(value, layers, where, entry=bool, names={True: True, False: False})
    config = _hf_text_config(Path(path))
    types = config.get("layer_types")
    if types is not None:
        return _checked(
            types,
            layers,
            f"{path}: config.json layer_types",
            entry=str,
            names={"sliding_attention": True, "full_attention": False},
        )
    period = config.get("sliding_window_pattern", DEFAULT_SWA_PATTERN.get(family, 0))
    return _checked(
        period, layers, f"{path}: config.json sliding_window_pattern", entry=int, names={}
    )


def _hf_text_config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json" if folder.is_dir() else folder
    config = parse_json(
        file.read_bytes(), where=str(file), max_bytes=_CONFIG_MAX_BYTES, error=ModelFormatError
    )
    if not isinstance(config, dict):
        raise ModelFormatError(f"{file}: not a JSON object")
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _checked(
    value: Any, layers: int, where: str, *, entry: type, names: dict[Any, bool]
) -> tuple[bool, ...]:
    """A period (a non-negative integer) or one ``entry`` per layer, each a key of
    ``names``; anything else is refused, never guessed."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return _from_period(value, layers)
    if (
        isinstance(value, list)
        and len(value) == layers
        and all(type(v) is entry and v in names for v in value)
    ):
        return tuple(names[v] for v in value)
    allowed = ", ".join(repr(n) for n in names)
    raise ModelFormatError(
        f"{where} is malformed: expected a period or {layers} entries of {allowed}",
        hint="the model's metadata is damaged; re-export it",
    )


def _from_period(period: int, layers: int) -> tuple[bool, ...]:
    """llama.cpp's set_swa_pattern (and transformers' sliding_window_pattern): with period
    n, layer i is windowed unless i % n == n - 1; n == 0 windows every layer; n == 1 none."""
    if period == 0:
        return (True,) * layers
    return tuple(i % period < period - 1 for i in range(layers))
