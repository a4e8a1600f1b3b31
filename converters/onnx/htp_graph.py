"""The builder's FP32 decoder as static-shape graphs the QNN HTP takes.

The onnxruntime-genai builder writes a CPU decoder with dynamic shapes: an ``attention_mask``
input whose subgraph computes GroupQueryAttention's ``seqlens_k`` / ``total_sequence_length``,
``SkipSimplifiedLayerNormalization`` (a contrib op QNN has no kernel for) and symbolic dims.
The HTP compiles fixed shapes only, so (following Olive's AttentionMaskToSequenceLengths):

- ``attention_mask`` and every node computed from it go; two int32 inputs replace them,
  ``past_seq_len`` [1, 1] (GQA's seqlens_k: total length - 1) and ``total_seq_len`` [], fed
  to every GroupQueryAttention (what onnxruntime-genai's decoder-pipeline feeds);
- each SkipSimplifiedLayerNormalization becomes Add (the residual sum, under the skip node's
  own sum output name) + SimplifiedLayerNormalization (QNN's RMSNorm);
- batch is 1, the KV cache is ``context`` long (past = total = context: a static buffer the
  pipeline shares between past and present), and the sequence dim is fixed per graph
  (the prompt window, or 1 for the token graph);
- shapes of every intermediate tensor come from ONNX Runtime's symbolic shape inference
  (onnx's own skips contrib ops such as GroupQueryAttention), which QNN needs.

Everything here works on the graph's structure (``load_external_data=False``): the weights
stay in their external-data file, so a model over protobuf's 2 GB limit is handled too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.errors import ConversionError

if TYPE_CHECKING:
    import onnx

PAST_SEQ_LEN = "past_seq_len"
TOTAL_SEQ_LEN = "total_seq_len"
SEQUENCE_DIM = "sequence_length"
_GQA = "GroupQueryAttention"
_SKIP_NORM = "SkipSimplifiedLayerNormalization"
_MASK = "attention_mask"
_KV_DIMS = ("past_sequence_length", "total_sequence_length", "past_sliding_length")
_INLINE_FOR_INFERENCE = 64 << 10  # external tensors up to this size are read for inference
_HINT = "the onnxruntime-genai builder's graph changed: this build expects its GQA decoder"


def load_structure(path: Path) -> onnx.ModelProto:
    """``path``'s graph without its weights (they stay in the external-data file)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def make_static(
    model: onnx.ModelProto, base_dir: Path, *, context: int, head_size: int
) -> onnx.ModelProto:
    """The builder's decoder with sequence-length inputs, no Skip* norms, batch 1 and a
    ``context``-long KV cache; the sequence dim stays symbolic (see ``fix_sequence``).

    Raises:
        ConversionError: the graph is not the builder's GQA decoder.
    """
    _replace_mask(model)
    _split_skip_norms(model)
    _drop_unused(model)
    values = {"batch_size": 1, "kv_cache_dim": head_size, **dict.fromkeys(_KV_DIMS, context)}
    _set_dims(model, values)
    return infer_shapes(model, base_dir)


def fix_sequence(model: onnx.ModelProto, seq: int, base_dir: Path) -> onnx.ModelProto:
    """A copy of ``model`` with its sequence dim fixed to ``seq``, shapes inferred again
    (its external weights lie in ``base_dir``)."""
    fixed = _copy(model)
    _set_dims(fixed, {SEQUENCE_DIM: seq})
    return infer_shapes(fixed, base_dir)


def infer_shapes(model: onnx.ModelProto, base_dir: Path) -> onnx.ModelProto:
    """``model`` with every tensor's shape, from ONNX Runtime's symbolic inference (it knows
    contrib ops). Its external weights (in ``base_dir``) are never loaded: the inference
    runs on a copy where each large one is a graph input of its shape, small ones (shape
    constants, whose values it may need) read inline.

    Raises:
        ConversionError: the inference failed.
    """
    from onnx import TensorProto, helper
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    light = _copy(model)
    del light.graph.value_info[:]
    keep, stand_ins = [], []
    for tensor in light.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            keep.append(tensor)
        elif _external_length(tensor) <= _INLINE_FOR_INFERENCE:
            keep.append(_inline(tensor, base_dir))
        else:
            stand_ins.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    del light.graph.initializer[:]
    light.graph.initializer.extend(keep)
    light.graph.input.extend(stand_ins)
    try:
        inferred = SymbolicShapeInference.infer_shapes(light, auto_merge=True)
    except Exception as exc:  # it raises bare Exception for an op it cannot type
        raise ConversionError(
            f"shape inference of the static graph failed: {type(exc).__name__}: {exc}",
            hint=_HINT,
        ) from exc
    if inferred is None:
        raise ConversionError("shape inference of the static graph gave no model", hint=_HINT)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    outputs = {o.name: o for o in inferred.graph.output}
    for out in model.graph.output:
        out.CopyFrom(outputs.get(out.name, out))
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _external_length(tensor: onnx.TensorProto) -> int:
    info = {e.key: e.value for e in tensor.external_data}
    try:
        return int(info.get("length", "-1"))
    except ValueError:
        return -1


def _inline(tensor: onnx.TensorProto, base_dir: Path) -> onnx.TensorProto:
    """A copy of a small external ``tensor`` with its bytes inline."""
    from edgekit.converters.onnx.htp_split import tensor_bytes

    copy = type(tensor)()
    copy.name, copy.data_type = tensor.name, tensor.data_type
    copy.dims.extend(tensor.dims)
    copy.raw_data = tensor_bytes(tensor, base_dir)
    return copy


def dynamic_io(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Graph inputs and outputs with a dim that is not a fixed int (empty: fully static)."""
    found: dict[str, list[int | str]] = {}
    for vi in list(model.graph.input) + list(model.graph.output):
        dims: list[int | str] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in vi.type.tensor_type.shape.dim
        ]
        if not vi.type.tensor_type.HasField("shape") or any(isinstance(d, str) for d in dims):
            found[vi.name] = dims
    return found


def layer_inputs(model: onnx.ModelProto, layers: int) -> list[str]:
    """The residual stream entering each layer 0..``layers`` (the last: the final norm's
    input): layer 0's input norm reads the embedding, layer i's (after the Skip* split)
    starts from the Add that sums the residual.

    Raises:
        ConversionError: a layer's input norm is missing.
    """
    norms: dict[int, str] = {}
    pattern = re.compile(r"^/model/layers\.(\d+)/(input_layernorm|final_norm_layernorm)/")
    for node in model.graph.node:
        match = pattern.match(node.name)
        if match is None:
            continue
        index = int(match.group(1))
        if node.op_type == "Add":
            norms[index] = node.output[0]
        elif node.op_type == "SimplifiedLayerNormalization" and index == 0:
            norms[index] = node.input[0]
    if 0 in norms:
        norms[0] = _float_source(model, norms[0])
    missing = [i for i in range(layers + 1) if i not in norms]
    if missing:
        raise ConversionError(
            f"the decoder has no input norm for layer(s) {missing[:5]}", hint=_HINT
        )
    return [norms[i] for i in range(layers + 1)]


def _float_source(model: onnx.ModelProto, name: str) -> str:
    """The float tensor behind a QuantizeLinear -> DequantizeLinear pair (a QDQ graph's
    consumers read the pair's output), else ``name``."""
    producer = {out: node for node in model.graph.node for out in node.output}
    dq = producer.get(name)
    q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
    return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else name


def _replace_mask(model: onnx.ModelProto) -> None:
    from onnx import TensorProto, helper

    graph = model.graph
    gqa = [n for n in graph.node if n.op_type == _GQA]
    if not gqa or _MASK not in {i.name for i in graph.input}:
        raise ConversionError(
            "the decoder has no GroupQueryAttention or attention_mask", hint=_HINT
        )
    if len({(n.input[5], n.input[6]) for n in gqa if len(n.input) > 6}) != 1 or any(
        len(n.input) <= 6 for n in gqa
    ):
        raise ConversionError(
            "GroupQueryAttention nodes read different sequence lengths", hint=_HINT
        )
    for node in gqa:
        node.input[5], node.input[6] = PAST_SEQ_LEN, TOTAL_SEQ_LEN
    dead: set[int] = set()
    frontier = {_MASK}
    for index, node in enumerate(graph.node):  # nodes are topologically sorted
        if node.op_type != _GQA and frontier.intersection(node.input):
            dead.add(index)
            frontier.update(node.output)
    keep = [n for i, n in enumerate(graph.node) if i not in dead]
    del graph.node[:]
    graph.node.extend(keep)
    inputs = [i for i in graph.input if i.name != _MASK]
    inputs[1:1] = [
        helper.make_tensor_value_info(PAST_SEQ_LEN, TensorProto.INT32, [1, 1]),
        helper.make_tensor_value_info(TOTAL_SEQ_LEN, TensorProto.INT32, []),
    ]
    del graph.input[:]
    graph.input.extend(inputs)


def _drop_unused(model: onnx.ModelProto) -> None:
    """Initializers no node reads any more (the mask subgraph's constants; Gemma 3's global
    RoPE caches when no layer is global)."""
    used = {name for node in model.graph.node for name in node.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def _split_skip_norms(model: onnx.ModelProto) -> None:
    """Skip* -> Add + SimplifiedLayerNormalization; the sum keeps the skip node's sum output
    name (the next layer reads it), or gets one when the builder left it unnamed."""
    from onnx import helper

    graph = model.graph
    nodes = []
    for node in graph.node:
        if node.op_type != _SKIP_NORM:
            nodes.append(node)
            continue
        if len(node.input) > 3 and node.input[3]:
            raise ConversionError(f"{node.name}: a skip norm with a bias", hint=_HINT)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{node.name}/sum"
        base = node.name.rsplit("/", 1)[0]
        nodes.append(helper.make_node("Add", list(node.input[:2]), [total], name=f"{base}/Add"))
        nodes.append(
            helper.make_node(
                "SimplifiedLayerNormalization",
                [total, node.input[2]],
                [node.output[0]],
                name=f"{base}/LayerNorm",
                axis=-1,
                epsilon=float(attrs.get("epsilon", 1e-6)),
                stash_type=1,
            )
        )
    del graph.node[:]
    graph.node.extend(nodes)


def _set_dims(model: onnx.ModelProto, values: dict[str, int]) -> None:
    for vi in list(model.graph.input) + list(model.graph.output):
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]
