"""The input of the HTP compile (``htp_compile``): a QDQ-stage HTP variant folder, read
and checked as hostile input before anything is compiled or written.

Only ``genai_config.json`` and ``edgekit.json`` say what is in the folder: both read with
a size bound and strict JSON from regular files (no link); edgekit.json an HTP variant's
(``format`` onnx, an HTP quant, ``htp.stage`` "qdq", 1 to 64 parts); the pipeline's
stages exactly ``embeddings`` + ``part{i}_prompt`` / ``part{i}_token`` for those parts,
running on (prompt, token) as a static pipeline does; each graph a plain file name of a
regular file in the folder, of a bounded size, whose external data are plain names of
regular files in the folder with every tensor inside its file.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.onnx.export import SETTINGS_FILE

from edgekit.errors import ModelFormatError
from edgekit.safe_files import UnsafePathError, open_regular, split_relative
from edgekit.untrusted import parse_json

GENAI_CONFIG = "genai_config.json"
QUANTS = ("W16A16", "W8A16", "FP16")
MAX_PARTS = 64
CONFIG_BYTES = 4 << 20  # genai_config.json: a few KB
SETTINGS_BYTES = 64 << 10  # edgekit.json
GRAPH_BYTES = 256 << 20  # a part graph keeps its weights in external data: its proto is small
DATA_BYTES = 16 << 30  # one external-data file (a part fits the HTP's 4 GiB session)
COPY_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is about 35 MB
COPIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
)
HINT = "rebuild the QDQ stage: edgekit convert MODEL --to onnx --quant W8A16 --recipe soc=SM8750"


@dataclass(frozen=True, kw_only=True)
class Graph:
    stage: str  # "part0_prompt"
    filename: str  # "part0.prompt.onnx"
    data: tuple[str, ...]  # its external-data files
    data_bytes: int

    @property
    def ctx_name(self) -> str:  # "part0.prompt_ctx.onnx"
        return self.filename[: -len(".onnx")] + "_ctx.onnx"


@dataclass(frozen=True, kw_only=True)
class QdqFolder:
    """A checked QDQ-stage folder: what its two JSON files say and the files they name."""

    path: Path
    quant: str
    config: dict[str, Any]  # genai_config.json
    settings: dict[str, Any]  # edgekit.json
    embeddings: Graph
    parts: tuple[tuple[Graph, Graph], ...]  # (prompt, token) per part
    copied: tuple[str, ...]  # tokenizer / config files present


def read_qdq_folder(path: Path) -> QdqFolder:
    """Read and check the QDQ-stage folder at ``path`` (see the module text).

    Raises:
        ModelFormatError: anything in it is not what edgekit's HTP builder writes.
    """
    if not path.is_dir() or path.is_symlink():
        raise ModelFormatError(f"{path} is not a folder", hint=HINT)
    settings = _json(path, SETTINGS_FILE, SETTINGS_BYTES)
    htp = settings.get("htp")
    quant = settings.get("quant")
    if settings.get("format") != "onnx" or not isinstance(htp, dict) or quant not in QUANTS:
        raise _bad(
            path, SETTINGS_FILE, f"is not an HTP variant's (quant one of {', '.join(QUANTS)})"
        )
    if htp.get("stage") != "qdq":
        raise _bad(path, SETTINGS_FILE, f"says stage {htp.get('stage')!r}, not 'qdq'")
    parts = htp.get("parts")
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS:
        raise _bad(path, SETTINGS_FILE, f"says {parts!r} parts, not 1 to {MAX_PARTS}")
    config = _json(path, GENAI_CONFIG, CONFIG_BYTES)
    stages = _pipeline(path, config, parts)
    embeddings = _graph(path, "embeddings", stages["embeddings"], (True, True))
    pairs = tuple(
        (
            _graph(path, f"part{i}_prompt", stages[f"part{i}_prompt"], (True, False)),
            _graph(path, f"part{i}_token", stages[f"part{i}_token"], (False, True)),
        )
        for i in range(parts)
    )
    names = [embeddings.filename] + [g.filename for pair in pairs for g in pair]
    if len(set(names)) != len(names):
        raise _bad(path, GENAI_CONFIG, "names one graph file for two stages")
    # every file of the compiled variant once: the embeddings' weights must not be named
    # like a context binary, a wrapper or a copied file (one would overwrite the other)
    written = [GENAI_CONFIG, SETTINGS_FILE, *COPIED, embeddings.filename, *embeddings.data]
    for graph in (g for pair in pairs for g in pair):
        written += [graph.ctx_name, graph.ctx_name[: -len(".onnx")] + "_qnn.bin"]
    clashes = sorted({n for n in written if written.count(n) > 1})
    if clashes:
        raise _bad(
            path,
            GENAI_CONFIG,
            f"makes the compiled variant write {', '.join(clashes)} twice (a graph or its "
            "weights named like another file of it)",
        )
    copied = tuple(n for n in COPIED if os.path.lexists(path / n))
    if "tokenizer.json" not in copied:
        raise _bad(path, "tokenizer.json", "is missing")
    return QdqFolder(
        path=path,
        quant=str(quant),
        config=config,
        settings=settings,
        embeddings=embeddings,
        parts=pairs,
        copied=copied,
    )


def _bad(folder: Path, name: str, what: str) -> ModelFormatError:
    return ModelFormatError(f"{folder / name} {what}", hint=HINT)


def _regular(folder: Path, name: object, where: str) -> tuple[str, int]:
    """``name`` as a plain file name of a regular file in ``folder``, and its size."""
    if not isinstance(name, str) or not name:
        raise _bad(folder, GENAI_CONFIG, f"names no file for {where}")
    try:
        if len(split_relative(name)) != 1:
            raise UnsafePathError(name, "is not a plain file name in the folder")
        fd = open_regular(folder, name)
    except UnsafePathError as exc:
        raise ModelFormatError(
            f"{folder}: {where} names {name!r}: {exc.message.split(': ', 1)[-1]}", hint=HINT
        ) from exc
    try:
        return name, os.fstat(fd).st_size
    finally:
        os.close(fd)


def _json(folder: Path, name: str, max_bytes: int) -> dict[str, Any]:
    _, size = _regular(folder, name, name)
    if size > max_bytes:
        raise _bad(folder, name, f"is {size:,} bytes, more than the {max_bytes:,} allowed")
    fd = open_regular(folder, name)
    with open(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    value = parse_json(
        data, where=str(folder / name), max_bytes=max_bytes, error=ModelFormatError, hint=HINT
    )
    if not isinstance(value, dict):
        raise _bad(folder, name, "is not a JSON object")
    return value


def _pipeline(folder: Path, config: dict[str, Any], parts: int) -> dict[str, dict[str, Any]]:
    model = config.get("model")
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(model, dict) or model.get("type") != "decoder-pipeline":
        raise _bad(folder, GENAI_CONFIG, "is not a decoder-pipeline (model.type)")
    pipeline = decoder.get("pipeline") if isinstance(decoder, dict) else None
    if not isinstance(pipeline, list) or len(pipeline) != 1 or not isinstance(pipeline[0], dict):
        raise _bad(folder, GENAI_CONFIG, "has no model.decoder.pipeline of one stage object")
    stages = pipeline[0]
    expected = ["embeddings"] + [f"part{i}_{p}" for i in range(parts) for p in ("prompt", "token")]
    if sorted(stages) != sorted(expected) or not all(isinstance(s, dict) for s in stages.values()):
        raise _bad(
            folder,
            GENAI_CONFIG,
            f"has pipeline stages {sorted(stages)[:8]}, not {', '.join(expected[:5])}"
            + ("..." if len(expected) > 5 else "")
            + f" for the {parts} parts {SETTINGS_FILE} says",
        )
    return stages


def _graph(folder: Path, stage: str, entry: dict[str, Any], runs: tuple[bool, bool]) -> Graph:
    name, size = _regular(folder, entry.get("filename"), f"stage {stage!r}")
    if not name.endswith(".onnx") or name.endswith("_ctx.onnx"):
        raise _bad(folder, GENAI_CONFIG, f"stage {stage!r} names {name!r}, not a QDQ .onnx graph")
    if (entry.get("run_on_prompt"), entry.get("run_on_token_gen")) != runs:
        raise _bad(folder, GENAI_CONFIG, f"stage {stage!r} does not run on (prompt, token) {runs}")
    if size > GRAPH_BYTES:
        raise _bad(folder, name, f"is {size:,} bytes: more than a graph with external data holds")
    data = _external_data(folder, name)
    return Graph(stage=stage, filename=name, data=tuple(data), data_bytes=sum(data.values()))


def _external_data(folder: Path, name: str) -> dict[str, int]:
    """The external-data files graph ``name`` references, checked: plain names of regular
    files in the folder, every tensor's bytes inside its file."""
    import onnx

    fd = open_regular(folder, name)
    with open(fd, "rb") as f:
        raw = f.read(GRAPH_BYTES + 1)
    try:
        model = onnx.load_model_from_string(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise _bad(folder, name, f"is not an ONNX model ({type(exc).__name__})") from exc
    sizes: dict[str, int] = {}
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location, size = _regular(folder, info.get("location"), f"{name}'s external data")
        if size > DATA_BYTES:
            raise _bad(folder, location, f"is {size:,} bytes, more than {DATA_BYTES:,}")
        try:
            end = int(info.get("offset", "0")) + int(info.get("length", "0"))
        except ValueError as exc:
            raise _bad(folder, name, f"tensor {tensor.name!r} has a bad offset") from exc
        if end > size:
            raise _bad(folder, name, f"tensor {tensor.name!r} reaches past the end of {location}")
        sizes[location] = size
    return sizes


def _tensors(graph: Any) -> list[Any]:
    """Every tensor of ``graph``: initializers and node attributes, subgraphs included."""
    found = list(graph.initializer) + [s.values for s in graph.sparse_initializer]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                found.append(attribute.t)
            found += list(attribute.tensors)
            if attribute.HasField("g"):
                found += _tensors(attribute.g)
            for sub in attribute.graphs:
                found += _tensors(sub)
    return found


def copy_file(src: Path, name: str, dest: Path) -> None:
    """Copy the regular file ``src/name`` (never through a link) to a new file in ``dest``."""
    _, size = _regular(src, name, name)
    if size > (DATA_BYTES if not name.endswith((".json", ".jinja")) else COPY_BYTES):
        raise _bad(src, name, f"is {size:,} bytes, larger than edgekit copies")
    fd = open_regular(src, name)
    with open(fd, "rb") as f, open(dest / name, "xb") as target:
        shutil.copyfileobj(f, target, 1 << 20)
