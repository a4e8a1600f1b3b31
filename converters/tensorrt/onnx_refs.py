"""What an export's model.onnx points at outside itself: every tensor stored as external
data must name ``model.onnx.data`` beside it, within that file's size.

An ONNX tensor's external data is a path written in the graph (``location``, with an
offset and a length). The engine builder resolves it relative to the graph's folder, so
a hostile bundle could name ``../../home/user/.ssh/id_rsa`` or an absolute path and have
its bytes read as weights; whether TensorRT's ONNX parser refuses that is not edgekit's
to assume. The exporter writes every weight into model.onnx.data, so nothing else is
allowed. The graph is parsed without loading any external data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from edgekit.errors import ModelFormatError, TargetUnavailableError

MAX_DEPTH = 32  # subgraphs (If / Loop bodies) nested deeper than any exporter writes
_INSTALL = "pip install onnx (the TensorRT extra installs it)"


def check_external_data(raw: bytes, where: str, data_name: str, data_bytes: int, hint: str) -> int:
    """Check the serialized ModelProto ``raw`` (from ``where``): every external tensor is
    in ``data_name``, inside its ``data_bytes``. Returns how many tensors are external.

    Raises:
        ModelFormatError: not an ONNX model, or a tensor whose data lies elsewhere or
            beyond the file's end.
        TargetUnavailableError: the onnx package is not installed.
    """
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError as exc:
        raise TargetUnavailableError(
            "reading an Edge-LLM export's graph needs the onnx package", hint=_INSTALL
        ) from exc
    try:
        model = onnx.load_model_from_string(raw)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ModelFormatError(f"{where}: not an ONNX model ({exc})", hint=hint) from exc
    external = 0
    for tensor in _model_tensors(model, where, hint):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        external += 1
        _check_one(tensor, where, data_name, data_bytes, hint)
    return external


def _check_one(tensor: Any, where: str, data_name: str, data_bytes: int, hint: str) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    name = str(tensor.name)[:80]
    location = info.get("location", "")
    if location != data_name:
        raise ModelFormatError(
            f"{where}: tensor {name!r} keeps its data in {location[:120]!r}, not {data_name} "
            "beside the graph",
            hint=hint,
        )
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else data_bytes - offset
    except ValueError as exc:
        raise ModelFormatError(
            f"{where}: tensor {name!r} has a malformed offset or length", hint=hint
        ) from exc
    if offset < 0 or length < 0 or offset + length > data_bytes:
        raise ModelFormatError(
            f"{where}: tensor {name!r} reads bytes {offset:,}..{offset + length:,} of "
            f"{data_name}, which holds {data_bytes:,}",
            hint=hint,
        )


def _model_tensors(model: Any, where: str, hint: str) -> Iterator[Any]:
    yield from _graph_tensors(model.graph, 0, where, hint)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node, 0, where, hint)


def _graph_tensors(graph: Any, depth: int, where: str, hint: str) -> Iterator[Any]:
    if depth > MAX_DEPTH:
        raise ModelFormatError(f"{where}: subgraphs nested over {MAX_DEPTH} deep", hint=hint)
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node, depth, where, hint)


def _node_tensors(node: Any, depth: int, where: str, hint: str) -> Iterator[Any]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        graphs = [attr.g] if attr.HasField("g") else []
        for graph in (*graphs, *attr.graphs):
            yield from _graph_tensors(graph, depth + 1, where, hint)
