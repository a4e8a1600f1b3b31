"""ModelSpec: what a model is, read from its metadata without loading its weights."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ModelFormat = Literal["hf", "gguf"]
ParameterSource = Literal["tensors", "config"]


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
