"""Split a static decoder into an embeddings graph and N parts for the QNN HTP.

The Hexagon maps at most about 4 GiB per session (the device profiles' ``max_model_gib``;
``recipe.part_gib``), so a model is cut at layer boundaries (the residual stream entering a
layer) into parts whose weights each fit the limit. Layers are spread evenly over the
fewest parts that fit; the final norm and lm_head go with the last part; the embedding is
its own sequence-dynamic graph that runs on the CPU (a Gather: nothing for the HTP to do).

Each part is written as two graphs, the prompt processor (sequence = the window) and the
token generator (sequence = 1), that reference ONE external-data file: same initializers,
same offsets, so the weights are on disk once (and the compiler can share them).

Everything works on graph structure; weights are copied tensor by tensor from the source's
external data (or its inline bytes), never the whole model in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.converters.onnx.htp_graph import PAST_SEQ_LEN, TOTAL_SEQ_LEN, fix_sequence

from edgekit.atomic import open_new, write_new
from edgekit.errors import ConversionError, UnsupportedConversionError

if TYPE_CHECKING:
    import onnx

GIB = 1 << 30
DEFAULT_PART_GIB = 4.0
INLINE_MAX = 1024  # smaller tensors (scales, zero points, shapes) stay inside the graph
_ALIGN = 4096  # external-data offsets page-aligned: ONNX Runtime can map them
_CHUNK = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Cut:
    """One part: the layers it runs and the tensors it reads and writes."""

    index: int
    layers: range
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nbytes: int  # its weights as the HTP holds them


def hidden_name(layer: int) -> str:
    """The pipeline's name for the residual stream entering ``layer``."""
    return f"hidden_states_{layer}"


def kv_names(layers: Iterable[int]) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")]
    return past, [p.replace("past_key_values", "present") for p in past]


def plan_parts(
    model: onnx.ModelProto,
    boundaries: Sequence[str],
    limit_gib: float,
    weigh: Callable[[onnx.TensorProto], int],
) -> list[Cut]:
    """The fewest parts, layers spread evenly, whose weights (``weigh`` per initializer)
    each fit ``limit_gib``; ``boundaries[i]`` is the tensor entering layer i, the last one
    the final norm's input.

    Raises:
        UnsupportedConversionError: one layer (the last with lm_head) exceeds the limit.
    """
    layers = len(boundaries) - 1
    limit = limit_gib * GIB
    sizes = {t.name: weigh(t) for t in model.graph.initializer}
    cuts: list[Cut] = []
    for count in range(1, layers + 1):
        cuts = [
            _cut(model, boundaries, index, span, sizes)
            for index, span in enumerate(_spread(layers, count))
        ]
        if all(c.nbytes <= limit for c in cuts):
            return cuts
    worst = max(cuts, key=lambda c: c.nbytes)
    what = "layer" if worst.index < len(cuts) - 1 else "last layer with the final norm and lm_head"
    raise UnsupportedConversionError(
        f"one {what} ({worst.nbytes / GIB:.3f} GiB) is bigger than part_gib={limit_gib:g}",
        hint="raise part_gib (the HTP maps up to 4 GiB per session), or build a smaller quant",
    )


def _spread(layers: int, count: int) -> list[range]:
    edges = [round(i * layers / count) for i in range(count + 1)]
    return [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _cut(
    model: onnx.ModelProto, bounds: Sequence[str], index: int, span: range, sizes: dict[str, int]
) -> Cut:
    past, present = kv_names(span)
    last = span.stop == len(bounds) - 1
    inputs = (bounds[span.start], PAST_SEQ_LEN, TOTAL_SEQ_LEN, *past)
    outputs = ("logits" if last else bounds[span.stop], *present)
    _, inits = reach(model, inputs, outputs)
    return Cut(
        index=index,
        layers=span,
        inputs=inputs,
        outputs=outputs,
        nbytes=sum(sizes[name] for name in inits),
    )


def reach(
    model: onnx.ModelProto, inputs: Sequence[str], outputs: Sequence[str]
) -> tuple[list[int], list[str]]:
    """The nodes (indices, in graph order) and initializers that compute ``outputs`` from
    ``inputs``.

    Raises:
        ConversionError: the cut is not one (something needs another graph input).
    """
    graph = model.graph
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    initializers = {t.name for t in graph.initializer}
    stop, seen, nodes, inits = set(inputs), set(), set(), set()
    todo = list(outputs)
    while todo:
        name = todo.pop()
        if not name or name in seen or name in stop:
            continue
        seen.add(name)
        if name in initializers:
            inits.add(name)
        elif name in producer:
            nodes.add(producer[name])
            todo.extend(graph.node[producer[name]].input)
        else:
            raise ConversionError(
                f"splitting the decoder: {name!r} is read but not an input of the part",
                hint="the builder's graph has a tensor crossing layers edgekit does not cut",
            )
    return sorted(nodes), sorted(inits)


def extract(
    model: onnx.ModelProto, inputs: Sequence[str], outputs: Sequence[str], rename: dict[str, str]
) -> onnx.ModelProto:
    """The subgraph from ``inputs`` to ``outputs`` (``rename``d), its initializers as they
    are (external references to the source), shapes from ``model``'s value_info."""
    from onnx import helper

    graph = model.graph
    nodes, inits = reach(model, inputs, outputs)
    infos = {v.name: v for v in [*graph.input, *graph.output, *graph.value_info]}
    missing = [n for n in [*inputs, *outputs] if n not in infos]
    if missing:
        raise ConversionError(f"splitting the decoder: no type for {missing[:3]}")
    keep = set(inits)
    part = helper.make_graph(
        [graph.node[i] for i in nodes],
        graph.name,
        [infos[n] for n in inputs],
        [infos[n] for n in outputs],
        [t for t in graph.initializer if t.name in keep],
    )
    new = helper.make_model(
        part, opset_imports=list(model.opset_import), ir_version=model.ir_version
    )
    _rename(new, rename)
    return new


def _rename(model: onnx.ModelProto, names: dict[str, str]) -> None:
    graph = model.graph
    for node in graph.node:
        node.input[:] = [names.get(x, x) for x in node.input]
        node.output[:] = [names.get(x, x) for x in node.output]
    for vi in [*graph.input, *graph.output]:
        vi.name = names.get(vi.name, vi.name)


def write_graphs(
    graphs: dict[str, onnx.ModelProto], source_dir: Path, out_dir: Path, data_name: str
) -> int:
    """Save ``graphs`` (file name -> model, all with the same initializers) in ``out_dir``
    with their large initializers in one file ``data_name`` they all reference; the weights
    are read from ``source_dir`` (where the source graph's external data lies). Returns
    the bytes of that data file."""
    first = next(iter(graphs.values()))
    placed: dict[str, tuple[int, int]] = {}
    with open_new(out_dir / data_name) as sink:
        for tensor in first.graph.initializer:
            data = tensor_bytes(tensor, source_dir)
            if len(data) < INLINE_MAX:
                continue
            offset = -(-sink.tell() // _ALIGN) * _ALIGN
            sink.write(b"\0" * (offset - sink.tell()))
            sink.write(data)
            placed[tensor.name] = (offset, len(data))
        size = sink.tell()
    for name, model in graphs.items():
        for tensor in model.graph.initializer:
            _place(tensor, source_dir, data_name, placed.get(tensor.name))
        write_new(out_dir / name, model.SerializeToString())
    return size


def tensor_bytes(tensor: onnx.TensorProto, source_dir: Path) -> bytes:
    from onnx import TensorProto, numpy_helper

    if tensor.data_location != TensorProto.EXTERNAL:
        return bytes(numpy_helper.to_array(tensor).tobytes())
    info = {e.key: e.value for e in tensor.external_data}
    location = Path(info.get("location", ""))
    if location.is_absolute() or ".." in location.parts or not location.name:
        raise ConversionError(f"{tensor.name}: external data outside the build folder")
    offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
    with open(source_dir / location, "rb") as f:
        f.seek(offset)
        data = f.read(length) if length >= 0 else f.read()
    if length >= 0 and len(data) != length:
        raise ConversionError(f"{tensor.name}: its external data is truncated")
    return data


def _place(
    tensor: onnx.TensorProto, source_dir: Path, data_name: str, where: tuple[int, int] | None
) -> None:
    """``tensor`` as raw bytes inline (small), or as a reference into ``data_name``."""
    from onnx import TensorProto

    raw = tensor_bytes(tensor, source_dir) if where is None else b""
    dims, dtype, name = list(tensor.dims), tensor.data_type, tensor.name
    tensor.Clear()
    tensor.name, tensor.data_type = name, dtype
    tensor.dims.extend(dims)
    if where is None:
        tensor.raw_data = raw
        return
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", data_name),
        ("offset", str(where[0])),
        ("length", str(where[1])),
    ):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def write_part(
    model: onnx.ModelProto,
    cut: Cut,
    boundaries: Sequence[str],
    source_dir: Path,
    out_dir: Path,
    window: int,
) -> dict[str, str]:
    """Part ``cut`` as its prompt (``window``) and token (1) graphs over one data file;
    returns the pipeline's names of its prompt/token files."""
    rename = {b: hidden_name(i) for i, b in enumerate(boundaries)}
    dynamic = extract(model, cut.inputs, cut.outputs, rename)
    stem = f"part{cut.index}"
    graphs = {
        f"{stem}.prompt.onnx": fix_sequence(dynamic, window, source_dir),
        f"{stem}.token.onnx": fix_sequence(dynamic, 1, source_dir),
    }
    write_graphs(graphs, source_dir, out_dir, f"{stem}.onnx.data")
    return {"prompt": f"{stem}.prompt.onnx", "token": f"{stem}.token.onnx"}


def write_embeddings(model: onnx.ModelProto, first: str, source_dir: Path, out_dir: Path) -> None:
    """The embedding as its own sequence-dynamic graph (input_ids -> hidden_states_0)."""
    graph = extract(model, ("input_ids",), (first,), {first: hidden_name(0)})
    write_graphs({"embeddings.onnx": graph}, source_dir, out_dir, "embeddings.onnx.data")


def check_part_gib(value: object) -> float:
    """``recipe.part_gib`` (None: 4 GiB) when it is a finite size above zero.

    Raises:
        UnsupportedConversionError: anything else (checked before writing).
    """
    if value is None:
        return DEFAULT_PART_GIB
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UnsupportedConversionError(
            f"part_gib={value!r} is not a size a part can fit",
            hint="give a finite size in GiB above 0 (default 4, the HTP's per-session limit)",
        )
    return float(value)
