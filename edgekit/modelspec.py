"""ModelSpec: what a model is, read from its metadata without loading its weights.

A ModelSpec is valid by construction: ``check_structure`` bounds every structural number
a model file claims (layers, widths, heads, vocabulary, context) before anything is sized
by it, and ``ModelSpec`` runs the same bounds on itself, so the planner, the converters
and ``pack`` can trust any spec they are handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from edgekit.errors import ModelFormatError
from edgekit.untrusted import clean_text

ModelFormat = Literal["hf", "gguf"]
ParameterSource = Literal["tensors", "config"]

# The largest structure a model may claim. Well above every released model (Llama 3.1
# 405B: 126 layers, hidden 16384, FFN 53248, 128 heads; Gemma 3: a 262,144-token
# vocabulary, head_dim 256; Llama 4 Scout: a 10M-token context), and low enough that
# nothing edgekit sizes by them (tensor tables, name maps, KV caches) can exhaust memory.
LIMITS: dict[str, int] = {
    "layers": 1024,
    "hidden_size": 1 << 16,
    "heads": 1024,
    "kv_heads": 1024,
    "head_dim": 4096,
    "ffn_size": 1 << 18,
    "vocab_size": 1 << 21,
    "context_length": 1 << 26,
    "sliding_window": 1 << 26,
}
_WHAT = {
    "layers": "layer count",
    "hidden_size": "hidden size",
    "heads": "attention head count",
    "kv_heads": "KV head count",
    "head_dim": "head dimension",
    "ffn_size": "feed-forward size",
    "vocab_size": "vocabulary size",
    "context_length": "context length",
    "sliding_window": "attention window",
}
# May be absent: KV heads default to the heads, head_dim to hidden / heads, no window.
_OPTIONAL = frozenset({"kv_heads", "head_dim", "sliding_window"})


def shown(value: object, max_len: int = 80) -> str:
    """A value from a file as a message may quote it: one line, bounded, escaped."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, str):
        return repr(clean_text(value, max_len=max_len))
    if isinstance(value, list | dict | tuple) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value):,} items"
    return clean_text(repr(value), max_len=max_len)


def check_structure(
    raw: Mapping[str, object], *, where: str, names: Mapping[str, str], hint: str
) -> dict[str, int | None]:
    """Validate the structural numbers of a decoder-only transformer.

    ``raw`` maps the keys of ``LIMITS`` to the values a file claims (None: absent),
    ``names`` maps them to the file's own key names for the messages. Returns the
    values with the defaults applied (KV heads = heads; head_dim = hidden / heads).

    Raises:
        ModelFormatError: a value that is missing, not an integer (booleans and floats
            are not), outside 1..LIMITS, KV heads that do not divide the heads, or heads
            that do not divide the hidden size when no head dimension is given.
    """
    out: dict[str, int | None] = {}
    for key, limit in LIMITS.items():
        value = raw.get(key)
        if value is None:
            if key not in _OPTIONAL:
                raise ModelFormatError(f"{where}: {names[key]} is missing", hint=hint)
            out[key] = None
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ModelFormatError(
                f"{where}: {names[key]} = {shown(value)} is not a plausible {_WHAT[key]} "
                f"(an integer from 1 to {limit:,})",
                hint=hint,
            )
        out[key] = value
    h = int(out["hidden_size"] or 0)  # required: never None past the loop
    n = int(out["heads"] or 0)
    if out["head_dim"] is None:
        if h % n:
            raise ModelFormatError(
                f"{where}: {names['heads']} = {n} does not divide {names['hidden_size']} = {h}, "
                f"and no {names['head_dim']} gives the head dimension",
                hint=hint,
            )
        out["head_dim"] = h // n
    kv = out["kv_heads"] if out["kv_heads"] is not None else n
    if kv > n or n % kv:
        raise ModelFormatError(
            f"{where}: {names['kv_heads']} = {kv} does not divide {names['heads']} = {n} "
            "(each KV head serves a whole group of query heads)",
            hint=hint,
        )
    out["kv_heads"] = kv
    return out


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """One tensor as its file header describes it.

    ``shape`` is in PyTorch order (outermost dimension first) for every source format;
    GGUF stores dimensions innermost first and is reversed on reading.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The facts about a causal language model that planning and conversion need.

    ``parameters`` is exact when ``parameters_source == "tensors"`` (summed from the tensor
    headers, a tied tensor counted once) and derived from the architecture's shapes when a
    folder holds only a config ("config").

    Raises:
        ModelFormatError: on construction, a structural number outside ``LIMITS``.
    """

    path: str
    format: ModelFormat
    family: str
    architecture: str
    name: str | None
    parameters: int
    parameters_source: ParameterSource
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    context_length: int
    tied_embeddings: bool
    sliding_window: int | None
    tokenizer: str | None
    chat_template: bool
    dtype: str
    file_type: str | None
    weight_bytes: int
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    def __post_init__(self) -> None:
        # The same bounds the readers apply, so that no code path can build a spec that
        # claims an implausible structure (head_dim is explicit here: no divisibility).
        raw = {key: getattr(self, key) for key in LIMITS}
        check_structure(
            raw,
            where=self.path,
            names={key: key for key in LIMITS},
            hint="the model's metadata is corrupt or not a causal language model's",
        )
        if self.parameters < 0 or self.weight_bytes < 0:
            raise ModelFormatError(f"{self.path}: negative parameter or byte counts")

    @property
    def kv_bytes_per_token_f16(self) -> int:
        """KV-cache bytes one token costs at f16 (keys and values, every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def to_dict(self, *, with_tensors: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["tensors"] = (
            [{**t, "shape": list(t["shape"])} for t in data["tensors"]] if with_tensors else None
        )
        if not with_tensors:
            del data["tensors"]
        data["kv_bytes_per_token_f16"] = self.kv_bytes_per_token_f16
        return data
