"""QNN HTP variants (converters/onnx/htp_build.py) of tiny random models of every family the
builder path supports, checked on the CPU provider: the QDQ graphs have fully static shapes
and the two graphs of a part share one weight file; the QDQ pipeline generates through
onnxruntime-genai directly and stays within stated bounds of the FP32 static graphs; FP16
equals them; a small part_gib splits the model without changing a token; what the HTP
build cannot do is refused before anything is written; the compile step runs when
onnxruntime-qnn is here (or the test says exactly why not)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters import convert
from edgekit.converters.onnx.export import BUILDABLE
from edgekit.converters.onnx.htp_build import hf_to_htp
from edgekit.converters.onnx.htp_graph import (
    dynamic_io,
    fix_sequence,
    load_structure,
    make_static,
)
from edgekit.converters.recipe import Recipe

from edgekit.errors import UnsupportedConversionError
from tests.conftest import require
from tests.tiny_models import build_tiny_model, training_text

FAMILIES = sorted(BUILDABLE)
WINDOW = 16  # a small prompt width: several windows over the compared text
CONTEXT = 512  # Gemma 3's tiny models slide a 512 window: GQA needs the whole of it
PROMPT_TOKENS = 40  # 2 full windows and a padded one, then token steps
TEXT_TOKENS = 64
NEW_TOKENS = 12
SOC = "SM8750"


@dataclass
class Builds:
    """Tiny sources, their FP32 static reference graphs and HTP builds, made once."""

    root: Path
    sources: dict[str, Path] = field(default_factory=dict)
    built: dict[tuple[str, str, float | None], Path] = field(default_factory=dict)
    references: dict[str, Path] = field(default_factory=dict)

    def source(self, family: str) -> Path:
        if family not in self.sources:
            path = build_tiny_model(family, self.root / f"{family}-hf")
            if family == "phi3":  # the Phi-3-mini-4k shape: one context, no LongRoPE
                config = json.loads((path / "config.json").read_text())
                config["original_max_position_embeddings"] = config["max_position_embeddings"]
                (path / "config.json").write_text(json.dumps(config))
            self.sources[family] = path
        return self.sources[family]

    def htp(self, family: str, quant: str = "W8A16", part_gib: float | None = None) -> Path:
        key = (family, quant, part_gib)
        if key not in self.built:
            out = self.root / f"{family}-{quant}-{part_gib or 'one'}"
            recipe = Recipe(weights=quant, soc=SOC, part_gib=part_gib)
            hf_to_htp(
                self.source(family),
                out,
                quant,
                recipe=recipe,
                window=WINDOW,
                context=CONTEXT,
                stop_at_qdq=True,
            )
            self.built[key] = out
        return self.built[key]

    def reference(self, family: str) -> Path:
        """The FP32 static prompt/token graphs (htp_graph on the CPU FP32 build), as a
        two-stage pipeline folder the runner below reads."""
        if family not in self.references:
            cpu = self.root / f"{family}-FP32"
            convert.convert_model(self.source(family), "onnx", cpu, quant="FP32")
            config = json.loads((cpu / "genai_config.json").read_text())
            head = config["model"]["decoder"]["head_size"]
            static = make_static(
                load_structure(cpu / "model.onnx"), cpu, context=CONTEXT, head_size=head
            )
            stages = {}
            for kind, seq in (("prompt", WINDOW), ("token", 1)):
                graph = fix_sequence(static, seq, cpu)
                (cpu / f"{kind}.onnx").write_bytes(graph.SerializeToString())
                stages[kind] = {
                    "filename": f"{kind}.onnx",
                    "run_on_prompt": kind == "prompt",
                    "run_on_token_gen": kind == "token",
                }
            (cpu / "reference.json").write_text(json.dumps(stages))
            self.references[family] = cpu
        return self.references[family]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    for module in (
        "onnxruntime_genai",
        "onnxruntime",
        "onnx",
        "torch",
        "transformers",
        "tokenizers",
    ):
        require(module, "the HTP build and its checks on the CPU provider need it")
    yield Builds(tmp_path_factory.mktemp("htp"))


def _stages(folder: Path) -> list[dict[str, Any]]:
    reference = folder / "reference.json"
    if reference.is_file():
        return list(json.loads(reference.read_text()).values())
    config = json.loads((folder / "genai_config.json").read_text())
    return list(config["model"]["decoder"]["pipeline"][0].values())


def teacher_forced(folder: Path, ids: list[int], prompt: int, window: int = WINDOW) -> Any:
    """Next-token logits [len(ids), vocab] of the static pipeline in ``folder``: the first
    ``prompt`` ids in windows of ``window`` (the last right-padded, as the pipeline pads),
    then one id at a time, each stage fed by name from the ones before it."""
    import numpy as np
    from edgekit.converters.onnx.htp_quantize import cpu_session

    stages = [(s, cpu_session(folder / s["filename"])) for s in _stages(folder)]
    cache: dict[str, Any] = {}
    for _, session in stages:
        for i in session.get_inputs():
            if i.name.startswith("past_key_values."):
                cache[i.name] = np.zeros(i.shape, np.float32)
    rows, pos = [], 0
    while pos < len(ids):
        step = min(window, prompt - pos) if pos < prompt else 1
        chunk = ids[pos : pos + step] + [0] * ((window if pos < prompt else 1) - step)
        width = len(chunk)
        tensors = {
            "input_ids": np.asarray([chunk], np.int64),
            "past_seq_len": np.asarray([[pos + width - 1]], np.int32),
            "total_seq_len": np.asarray(pos + width, np.int32),
            **cache,
        }
        for stage, session in stages:
            if stage["run_on_prompt" if pos < prompt else "run_on_token_gen"]:
                feeds = {i.name: tensors[i.name] for i in session.get_inputs()}
                names = [o.name for o in session.get_outputs()]
                tensors.update(zip(names, session.run(None, feeds), strict=True))
        rows.append(tensors["logits"][0, :step])
        cache = {p: tensors[p.replace("past_key_values", "present")] for p in cache}
        pos += step
    return np.concatenate(rows, 0)


def genai_greedy(folder: Path, prompt: list[int], new: int = NEW_TOKENS) -> list[int]:
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    out: list[int] = []
    while not generator.is_done() and len(out) < new:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def text_ids(folder: Path, count: int = TEXT_TOKENS) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return tokenizer.encode(training_text(), add_special_tokens=False).ids[:count]


def kl_top1(reference: Any, other: Any) -> tuple[float, float]:
    """Mean KL(reference || other) per position and top-1 agreement."""
    import numpy as np

    def log_softmax(x: Any) -> Any:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p, q = log_softmax(reference.astype(np.float64)), log_softmax(other.astype(np.float64))
    kl = float((np.exp(p) * (p - q)).sum(-1).mean())
    return kl, float((reference.argmax(-1) == other.argmax(-1)).mean())


# Bounds for W8A16 (QDQ on the CPU provider) against the FP32 static graphs, teacher-forced
# over the first TEXT_TOKENS tokens of the shipped Austen excerpt (PROMPT_TOKENS through the
# prompt graph in windows of WINDOW, the rest through the token graph). Measured on these
# tiny random models (hidden 64, 2 layers, vocab 512): mean KL 3.5e-4 (gemma3) to 9.8e-4
# (llama), top-1 agreement 0.92 (llama) to 0.98 (gemma3, mistral). The bounds leave 3x on
# KL and 0.12 on agreement (random weights give small top-1 margins: one flip is 1/64).
# What they exclude: a build with wrong weights or a wrong cache position (the CPU suite
# measured KL 1.0 and agreement <= 0.02 between two seeds).
MAX_KL, MIN_TOP1 = 3e-3, 0.80


@pytest.mark.parametrize("family", FAMILIES)
def test_qdq_graphs_are_static_and_share_weights(builds: Builds, family: str) -> None:
    import onnx

    folder = builds.htp(family)
    settings = json.loads((folder / "edgekit.json").read_text())
    assert settings["format"] == "onnx" and settings["quant"] == "W8A16"
    assert settings["htp"]["stage"] == "qdq" and settings["htp"]["soc"] == SOC
    assert settings["htp"]["window"] == WINDOW and settings["htp"]["context_length"] == CONTEXT
    for i in range(settings["htp"]["parts"]):
        graphs = [load_structure(folder / f"part{i}.{kind}.onnx") for kind in ("prompt", "token")]
        for graph, seq in zip(graphs, (WINDOW, 1), strict=True):
            assert dynamic_io(graph) == {}
            first = graph.graph.input[0]
            assert first.name.startswith("hidden_states_")
            assert first.type.tensor_type.shape.dim[1].dim_value == seq
            assert any(n.op_type == "QuantizeLinear" for n in graph.graph.node)

        def weights(graph: onnx.ModelProto) -> list[tuple[Any, ...]]:
            return [
                (
                    t.name,
                    tuple(t.dims),
                    t.data_type,
                    t.raw_data,
                    tuple((e.key, e.value) for e in t.external_data),
                )
                for t in graph.graph.initializer
            ]

        prompt, token = (weights(g) for g in graphs)
        assert prompt == token  # same tensors at the same offsets of one file
        locations = {dict(w[4]).get("location") for w in prompt if w[4]}
        assert locations == {f"part{i}.onnx.data"}
    assert dynamic_io(load_structure(folder / "embeddings.onnx")).keys() == {
        "input_ids",
        "hidden_states_0",
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_qdq_close_to_fp32_static_and_generates(builds: Builds, family: str) -> None:
    folder = builds.htp(family)
    ids = text_ids(folder)
    assert len(ids) == TEXT_TOKENS
    reference = teacher_forced(builds.reference(family), ids, PROMPT_TOKENS)
    qdq = teacher_forced(folder, ids, PROMPT_TOKENS)
    kl, top1 = kl_top1(reference, qdq)
    assert kl <= MAX_KL and top1 >= MIN_TOP1, (kl, top1)
    # onnxruntime-genai runs the pipeline as the runner above does: its greedy tokens are
    # the argmax of the runner's logits over the prompt and those same tokens
    prompt = ids[:PROMPT_TOKENS]
    tokens = genai_greedy(folder, prompt)
    assert len(tokens) == NEW_TOKENS
    forced = teacher_forced(folder, prompt + tokens, PROMPT_TOKENS)
    assert forced[PROMPT_TOKENS - 1 : -1].argmax(-1).tolist() == tokens


def test_fp16_stage_equals_fp32_static(builds: Builds) -> None:
    """FP16 ships the float graph (the HTP runs it at fp16): on the CPU its parts compute
    what the FP32 static graphs do (same ops, same weights, cut between layers)."""
    import numpy as np

    folder = builds.htp("llama", "FP16")
    settings = json.loads((folder / "edgekit.json").read_text())
    assert settings["quant"] == "FP16" and settings["htp"]["calibration"] is None
    ids = text_ids(folder)
    reference = teacher_forced(builds.reference("llama"), ids, PROMPT_TOKENS)
    fp16 = teacher_forced(folder, ids, PROMPT_TOKENS)
    # measured: max abs difference 0 to a few 1e-7 (float summation order); logits ~1
    assert float(np.abs(reference - fp16).max()) < 1e-4
    assert not any(
        n.op_type == "QuantizeLinear"
        for n in load_structure(folder / "part0.prompt.onnx").graph.node
    )


def test_small_part_gib_splits_without_changing_tokens(builds: Builds) -> None:
    import numpy as np

    one = builds.htp("llama")
    # measured on the tiny llama: a layer holds 37 KB of uint8 weights, the uint16 RoPE
    # caches 33 KB (in every part), lm_head 33 KB: the whole model 140 KB, split in two
    # 70 KB + 103 KB. 110 KB fits the two parts, not the whole
    split = builds.htp("llama", part_gib=110e3 / (1 << 30))
    settings = json.loads((split / "edgekit.json").read_text())
    assert settings["htp"]["parts"] == 2
    stages = json.loads((split / "genai_config.json").read_text())["model"]["decoder"]
    assert list(stages["pipeline"][0]) == [
        "embeddings",
        "part0_prompt",
        "part0_token",
        "part1_prompt",
        "part1_token",
    ]
    whole_bytes = (one / "part0.onnx.data").stat().st_size
    for i in range(2):
        assert (split / f"part{i}.onnx.data").stat().st_size < whole_bytes
    ids = text_ids(one)
    prompt = ids[:PROMPT_TOKENS]
    assert genai_greedy(split, prompt) == genai_greedy(one, prompt)
    # quantized once before the cut: the same graph, so the same logits
    whole, parts = (teacher_forced(f, ids, PROMPT_TOKENS) for f in (one, split))
    assert float(np.abs(whole - parts).max()) < 1e-5


def _refused(builds: Builds, tmp_path: Path, quant: str, recipe: str | None) -> str:
    out = tmp_path / "out"
    with pytest.raises(UnsupportedConversionError) as caught:
        convert.convert_model(builds.source("llama"), "onnx", out, quant=quant, recipe=recipe)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no scratch folder left either
    return str(caught.value)


@pytest.mark.parametrize(
    ("quant", "recipe", "says"),
    [
        ("W8A16", None, "Snapdragon SoC"),
        ("FP16", None, "Snapdragon SoC"),
        ("W8A16", "soc=SM1234", "SM1234"),
        ("INT4", "soc=SM8750", "CPU build"),
        ("FP32", "part_gib=2", "CPU build"),
        ("W8A16", "soc=SM8750,part_gib=0", "part_gib"),
        ("W8A16", "soc=SM8750,part_gib=-1", "part_gib"),
        ("W8A16", "soc=SM8750,part_gib=nan", "part_gib"),
        ("W8A16", "soc=SM8750,part_gib=inf", "part_gib"),
        ("W8A16", "soc=SM8750,part_gib=0.00001", "bigger than part_gib"),
        ("W8A16", "soc=SM8750,group_size=32", "group_size"),
        ("FP16", "soc=SM8750,calibration=x.txt", "calibration"),
        ("W8A16", "soc=SM8750,kv_cache=q8_0", "KV-cache"),
    ],
)
def test_refused_before_writing(
    builds: Builds, tmp_path: Path, quant: str, recipe: str | None, says: str
) -> None:
    assert says in _refused(builds, tmp_path, quant, recipe)


def test_calibration_file_checked_before_writing(builds: Builds, tmp_path: Path) -> None:
    binary = tmp_path.parent / f"{tmp_path.name}-calibration.bin"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    assert "not UTF-8" in _refused(builds, tmp_path, "W8A16", f"soc=SM8750,calibration={binary}")


def test_compile_step(builds: Builds, tmp_path: Path) -> None:
    """The one test that lets the build compile: the QNN context stage when onnxruntime-qnn
    can compile here; otherwise the QDQ stage ships with a warning naming the reason."""
    from edgekit.converters.onnx.htp_compile import compile_unavailable

    out = tmp_path / "ctx"
    result = hf_to_htp(
        builds.source("llama"),
        out,
        "W8A16",
        recipe=Recipe(weights="W8A16", soc=SOC),
        window=WINDOW,
        context=CONTEXT,
    )
    why = compile_unavailable()
    settings = json.loads((out / "edgekit.json").read_text())
    if why:
        assert settings["htp"]["stage"] == "qdq"
        assert any(why in w for w in result.warnings)
        pytest.skip(f"the compile step cannot run here: {why}")
    assert settings["htp"]["stage"] == "context"
    names = {p.name for p in out.iterdir()}
    assert {"part0.prompt_ctx.onnx", "part0.token_ctx.onnx"} <= names
    assert any(n.endswith(".bin") for n in names)
    assert not any(n in names for n in ("part0.prompt.onnx", "part0.token.onnx"))


def test_split_plan_spreads_layers_and_refuses_a_layer_too_big(builds: Builds) -> None:
    """The exact check on the built graph (the planner's estimate is checked before the
    build; this one decides the cut): fewest parts, layers spread evenly, and one layer
    over the limit refused."""
    from edgekit.converters.onnx.htp_build import _weigher
    from edgekit.converters.onnx.htp_graph import layer_inputs
    from edgekit.converters.onnx.htp_split import GIB, plan_parts

    folder = builds.reference("llama")
    static = make_static(
        load_structure(folder / "model.onnx"), folder, context=CONTEXT, head_size=16
    )
    bounds = layer_inputs(static, 2)
    weigh = _weigher("FP16")
    whole = plan_parts(static, bounds, 4.0, weigh)
    assert [c.layers for c in whole] == [range(0, 2)]
    halves = plan_parts(static, bounds, (whole[0].nbytes - 1) / GIB, weigh)
    assert [c.layers for c in halves] == [range(0, 1), range(1, 2)]
    assert halves[1].outputs[0] == "logits" and halves[0].outputs[0] == bounds[1]
    with pytest.raises(UnsupportedConversionError, match="bigger than part_gib"):
        plan_parts(static, bounds, (halves[1].nbytes - 1) / GIB, weigh)


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_is_what_the_parts_hold(builds: Builds, family: str) -> None:
    """The planner's W8A16 layout against the built files: the CPU embedding's f32 bytes
    exactly, the parts' weights within 2% (the layout leaves out the activations' scales
    and zero points: measured 0.3-0.5% of these tiny models' parts)."""
    from edgekit.converters.onnx import FORMAT
    from edgekit.converters.onnx.htp_build import _weigher

    from edgekit.inspection import inspect_model

    folder = builds.htp(family)
    layout = FORMAT.layout(inspect_model(builds.source(family)), "W8A16")
    embedding = sum(t.nbytes for t in layout.tensors if t.role == "token_embd")
    assert embedding == (folder / "embeddings.onnx.data").stat().st_size
    weigh = _weigher("W8A16")
    held = sum(weigh(t) for t in load_structure(folder / "part0.prompt.onnx").graph.initializer)
    planned = layout.total_bytes - embedding
    assert abs(held - planned) <= 0.02 * held, (held, planned)


def test_w16a16_is_closer_to_fp32_than_w8a16(builds: Builds) -> None:
    """uint16 weights (W16A16) lose less than uint8 ones against the FP32 static graphs:
    on SmolLM2-135M 0.022 against 0.45 nats/token (QUANT_CONFIGS says how it was
    measured); on the tiny Llama the same order, with the same activation quantization."""
    ids = text_ids(builds.htp("llama"))
    reference = teacher_forced(builds.reference("llama"), ids, PROMPT_TOKENS)
    kl8, _ = kl_top1(reference, teacher_forced(builds.htp("llama", "W8A16"), ids, PROMPT_TOKENS))
    kl16, top16 = kl_top1(
        reference, teacher_forced(builds.htp("llama", "W16A16"), ids, PROMPT_TOKENS)
    )
    assert kl16 < kl8 and kl16 <= MAX_KL and top16 >= MIN_TOP1, (kl16, kl8, top16)
    settings = json.loads((builds.htp("llama", "W16A16") / "edgekit.json").read_text())
    assert settings["quant"] == "W16A16"
