"""The conversion graph: routes over the format packages' edges, refusals that say what
is reachable, every step checked before anything is written, intermediates shared."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from edgekit.converters import convert, graph
from edgekit.converters.formats import ConvertRequest, Edge, Format, Quant
from edgekit.converters.gguf import FORMAT as GGUF
from edgekit.converters.layouts import WeightLayout
from edgekit.converters.mlx import FORMAT as MLX
from edgekit.converters.onnx import FORMAT as ONNX
from edgekit.converters.openvino import FORMAT as OPENVINO
from edgekit.converters.recipe import Recipe
from edgekit.converters.tensorrt import FORMAT as TENSORRT

from edgekit.architectures import dimensions_from_config, expected_tensors, family_for_hf
from edgekit.errors import TargetUnavailableError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.modelspec import ModelSpec
from tests.builders import (
    full_tiny_gguf_tensors,
    gguf_bytes,
    tiny_config,
    tiny_gguf_metadata,
    write_hf_folder,
)
from tests.conftest import require

# The graph is built from the registry in the product; the tests name the formats.
BUILT = (GGUF, OPENVINO)


def _steps(source: str, output: str, formats: tuple[Format, ...] = BUILT) -> list[str]:
    return [f"{e.source}->{e.output}" for e in graph.route(source, output, formats)]


def test_routes_are_the_shortest_chains_of_edges() -> None:
    assert _steps("hf", "gguf") == ["hf->gguf"]
    assert _steps("gguf", "gguf") == ["gguf->gguf"]  # requantize: one edge, not a detour
    assert _steps("gguf", "hf") == ["gguf->hf"]
    assert _steps("hf", "openvino") == ["hf->openvino"]
    # OpenVINO exports from a Hugging Face folder: a GGUF is dequantized on the way
    assert _steps("gguf", "openvino") == ["gguf->hf", "hf->openvino"]


def test_outputs_and_reachable_follow_the_edges() -> None:
    assert graph.outputs(BUILT) == ("gguf", "openvino", "hf")
    assert graph.reachable("hf", BUILT) == ("gguf", "openvino")  # not back to itself
    assert graph.reachable("gguf", BUILT) == ("gguf", "openvino", "hf")
    assert graph.reachable("openvino", BUILT) == ()
    # a format without edges adds no output; one with edges adds its own
    assert graph.outputs((*BUILT, PLANNED)) == ("gguf", "openvino", "hf")
    assert graph.outputs((*BUILT, TENSORRT)) == ("gguf", "openvino", "tensorrt", "hf")
    assert graph.outputs((*BUILT, ONNX)) == ("gguf", "openvino", "onnx", "hf")
    assert graph.outputs((*BUILT, MLX)) == ("gguf", "openvino", "mlx", "hf")
    # MLX converts a Hugging Face folder: a GGUF is dequantized on the way
    route = graph.route("gguf", "mlx", (*BUILT, MLX))
    assert [f"{e.source}->{e.output}" for e in route] == ["gguf->hf", "hf->mlx"]
    route = graph.route("gguf", "tensorrt", (*BUILT, TENSORRT))
    assert [f"{e.source}->{e.output}" for e in route] == ["gguf->hf", "hf->tensorrt"]


def test_unknown_output_lists_what_edgekit_writes() -> None:
    with pytest.raises(UnsupportedConversionError, match="unknown output format 'tflite'") as e:
        graph.route("hf", "tflite", BUILT)
    assert e.value.hint == "use gguf, openvino or hf"


class _PlannedFormat(type(TENSORRT)):  # type: ignore[misc]
    """A format edgekit sizes and plans but has no conversion for (every registered
    format converts today)."""

    name: ClassVar[str] = "planned"
    display: ClassVar[str] = "Planned"
    buildable: ClassVar[bool] = False

    def edges(self) -> tuple[Edge, ...]:
        return ()


PLANNED = _PlannedFormat()


def test_a_planned_format_is_refused_as_not_buildable_yet() -> None:
    assert not PLANNED.buildable and PLANNED.edges() == ()
    with pytest.raises(UnsupportedConversionError, match="cannot build Planned models yet") as e:
        graph.route("hf", "planned", (*BUILT, PLANNED))
    assert e.value.hint == "use gguf, openvino or hf"


def test_no_route_says_what_is_reachable() -> None:
    with pytest.raises(UnsupportedConversionError, match="a Hugging Face folder to a Hugging") as e:
        graph.route("hf", "hf", BUILT)
    assert e.value.hint == "convert it --to gguf or openvino"
    with pytest.raises(UnsupportedConversionError, match="OpenVINO to GGUF") as e:
        graph.route("openvino", "gguf", BUILT)
    assert e.value.hint == "no conversion starts there"


def test_the_product_graph_is_the_registered_formats() -> None:
    """Without ``formats`` the graph reads the registry: today's targets give today's
    outputs (a target added with a new format would add its own)."""
    assert graph.outputs() == graph.outputs((GGUF, MLX, OPENVINO, ONNX, TENSORRT))
    assert _steps("gguf", "openvino") == [
        f"{e.source}->{e.output}" for e in graph.route("gguf", "openvino")
    ]


# --- GGUF Q4_1 -> OpenVINO INT4: the route pack takes for the default model -------------


def _q4_1_gguf(path: Path) -> Path:
    """A GGUF whose header says Q4_1 (llama.cpp file type 3), as the default model is."""
    metadata = {**tiny_gguf_metadata(), "general.file_type": 3}
    path.write_bytes(gguf_bytes(metadata, full_tiny_gguf_tensors()))
    return path


def test_a_q4_1_gguf_routes_to_openvino_int4_through_hf(tmp_path: Path) -> None:
    src = _q4_1_gguf(tmp_path / "model.gguf")
    spec = inspect_model(src)
    assert (spec.format, spec.file_type) == ("gguf", "Q4_1")
    try:
        route = convert.check_conversion(
            spec, src, "openvino", quant="INT4", recipe=Recipe(weights="INT4")
        )
    except TargetUnavailableError:
        require("optimum.intel", "the OpenVINO export checks its tools")
        raise
    assert [f"{e.source}->{e.output}" for e in route] == ["gguf->hf", "hf->openvino"]
    # the last step's checks ran on the route's source: a bad option is refused up front
    with pytest.raises(UnsupportedConversionError, match="KV-cache type"):
        convert.check_conversion(
            spec, src, "openvino", quant="INT4", recipe=Recipe(weights="INT4", kv_cache="q4_0")
        )
    with pytest.raises(UnsupportedConversionError, match="OpenVINO format edgekit writes"):
        convert.check_conversion(spec, src, "openvino", quant="Q4_K_M", recipe=None)
    assert list(tmp_path.iterdir()) == [src]


def test_convert_refuses_before_writing_when_a_later_step_fails(tmp_path: Path) -> None:
    src = _q4_1_gguf(tmp_path / "model.gguf")
    out = tmp_path / "out"
    with pytest.raises(UnsupportedConversionError, match="KV-cache type"):
        convert.convert_model(src, "openvino", out, quant="INT4", recipe="kv_cache=q4_0")
    assert list(tmp_path.iterdir()) == [src]  # no intermediate, no output


def test_already_in_the_output_kind(tmp_path: Path, tiny_hf: Path) -> None:
    with pytest.raises(UnsupportedConversionError, match="is already a Hugging Face folder") as e:
        convert.convert_model(tiny_hf, "hf", tmp_path / "out")
    assert e.value.hint == "convert it --to gguf or mlx or openvino or onnx or tensorrt"


@pytest.fixture
def tiny_hf(tmp_path: Path) -> Path:
    """A Hugging Face folder of a tiny Llama (zero weights: only its shape is read)."""
    config = tiny_config("llama")
    fam = family_for_hf("llama")
    dims = dimensions_from_config(config, fam, "t")
    tensors = {t.name: (t.shape, "BF16") for t in expected_tensors(fam, dims)}
    return write_hf_folder(tmp_path / "hf", config, tensors)


# --- a route of recording edges: checks first, then runs, intermediates shared -----------


@dataclass
class _Log:
    calls: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)  # "check:a->b" names to refuse


def _recording_format(name: str, source: str, log: _Log) -> Format:
    def check(req: ConvertRequest) -> None:
        step = f"check:{source}->{name}"
        log.calls.append(f"{step}@{'dest' if req.out else 'none'}:{req.quant}")
        if step in log.refuse:
            raise UnsupportedConversionError(f"refused {step}")

    def run(req: ConvertRequest) -> tuple[str, ...]:
        out = req.destination()
        log.calls.append(f"run:{source}->{name}:{req.src.name}->{out.name}:{req.quant}")
        if name == "mid":  # an intermediate is a model the next step inspects: the source again
            shutil.copytree(req.src, out)
        else:
            out.write_text(name)
        return (f"wrote {name}",)

    class Recording(Format):
        display: ClassVar[str] = name.upper()
        entry: ClassVar[str] = ""
        default_quant: ClassVar[str] = "LOSSY"
        quants: ClassVar[dict[str, Quant]] = {
            "LOSSY": Quant(name="LOSSY", bits_per_weight=4.0),
            "EXACT": Quant(name="EXACT", bits_per_weight=16.0, lossless=True),
        }

        def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> Any:
            return WeightLayout(format=quant, tensors=(), tied_embeddings=False)

        def edges(self) -> tuple[Edge, ...]:
            return (
                Edge(source=source, output=name, check=check, run=run, describe=f"-> {name}"),
            )

    Recording.name = name
    return Recording()


def _chain(log: _Log) -> tuple[Format, ...]:
    # hf -> mid -> end: "end" is reachable from a Hugging Face folder only through "mid"
    return (_recording_format("mid", "hf", log), _recording_format("end", "mid", log))


def _patch_registry(monkeypatch: pytest.MonkeyPatch, formats: tuple[Format, ...]) -> None:
    monkeypatch.setattr(graph, "all_formats", lambda: formats)
    by_name: Callable[[str], Format] = lambda n: next(f for f in formats if f.name == n)  # noqa: E731
    monkeypatch.setattr(convert, "get_format", by_name)


def test_every_step_is_checked_before_any_runs(
    tmp_path: Path, tiny_hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _Log(refuse={"check:mid->end"})
    _patch_registry(monkeypatch, _chain(log))
    out = tmp_path / "out"
    with pytest.raises(UnsupportedConversionError, match="refused check:mid->end"):
        convert.convert_model(tiny_hf, "end", out)
    # both checked (the intermediate as lossless, the output at its default), none ran
    assert log.calls == ["check:hf->mid@none:EXACT", "check:mid->end@none:LOSSY"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_route_runs_through_a_private_intermediate(
    tmp_path: Path, tiny_hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _Log()
    _patch_registry(monkeypatch, _chain(log))
    out = tmp_path / "out"
    result = convert.convert_model(tiny_hf, "end", out, quant="lossy")
    assert (result.path, result.format, result.quant) == (out, "end", "LOSSY")
    assert result.warnings == ("wrote mid", "wrote end")
    assert log.calls[:2] == ["check:hf->mid@none:EXACT", "check:mid->end@none:LOSSY"]
    # the later step is checked again on the real intermediate, then runs from it
    assert log.calls[2] == "run:hf->mid:hf->hf.mid-intermediate:EXACT"
    assert log.calls[3:] == [
        "check:mid->end@dest:LOSSY",
        "run:mid->end:hf.mid-intermediate->out:LOSSY",
    ]
    assert out.read_text() == "end"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]  # scratch removed


def test_convert_along_reuses_an_intermediate(
    tmp_path: Path, tiny_hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pack converts several variants along routes that share a first step: the
    intermediate is written once."""
    log = _Log()
    formats = _chain(log)
    _patch_registry(monkeypatch, formats)
    route = graph.route("hf", "end")
    spec = inspect_model(tiny_hf)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reuse: dict[tuple[Path, str], Path] = {}
    for quant in ("LOSSY", "EXACT"):
        convert.convert_along(
            route,
            tiny_hf,
            spec,
            tmp_path / f"out-{quant}",
            quant=quant,
            recipe=None,
            scratch=scratch,
            reuse=reuse,
        )
    runs = [c for c in log.calls if c.startswith("run:")]
    assert runs == [
        "run:hf->mid:hf->hf.mid-intermediate:EXACT",
        "run:mid->end:hf.mid-intermediate->out-LOSSY:LOSSY",
        "run:mid->end:hf.mid-intermediate->out-EXACT:EXACT",
    ]
    assert reuse == {(tiny_hf, "mid"): scratch / "hf.mid-intermediate"}


# --- the real route, end to end ---------------------------------------------------------


@pytest.mark.slow
def test_gguf_q4_1_to_openvino_int4_end_to_end(tmp_path: Path) -> None:
    require("transformers", "tiny models are built with transformers")
    require("llama_cpp", "quantizing to Q4_1 needs llama.cpp")
    require("optimum.intel", "the OpenVINO export needs optimum-intel")
    from tests.tiny_models import build_tiny_model

    hf = build_tiny_model("llama", tmp_path / "hf")
    q4_1 = convert.convert_model(hf, "gguf", tmp_path / "m.gguf", quant="Q4_1")
    assert q4_1.quant == "Q4_1" and inspect_model(q4_1.path).file_type == "Q4_1"
    result = convert.convert_model(q4_1.path, "openvino", tmp_path / "ov", quant="int4")
    assert (result.format, result.quant) == ("openvino", "INT4")
    assert (result.path / "openvino_model.xml").is_file()
    assert any("quantization error" in w for w in result.warnings), result.warnings
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.gguf", "ov"]
