"""The QNN HTP variant's compile step (converters/onnx/htp_compile.py) and the target side
of HTP variants (targets/qnn.py): a tiny random Llama built to the QDQ stage by edgekit's
HTP builder, compiled here into EPContext context binaries for the three SoCs (one shared
context per part, and one binary per graph), the per-graph binaries run on this host's
HTP simulator (onnxruntime-qnn's x86_64 libQnnHtp.so) through onnxruntime-genai, the QDQ
stage on the CPU provider, the context stage refused here, hostile QDQ folders refused
before anything is compiled or written.

Needs onnxruntime-qnn (the 'all' extra); skipped, saying so, without it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from edgekit.errors import ConversionError, ModelFormatError, TargetUnavailableError
from tests.conftest import require

PROMPT = "It is a truth universally acknowledged, that a single man"
GREEDY: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
SOC_KEYS = ("SM8750", "SM8650", "SC8380XP")
SIM_TOKENS = 6  # the simulator runs the tiny model at ~0.5 s a token here


def _require_all() -> None:
    require("onnxruntime_qnn", "the QNN execution provider compiles the context binaries")
    require("onnxruntime_genai", "the variants run through onnxruntime-genai")
    require("onnx", "the HTP builder and the compiler read ONNX graphs")
    require("onnx_ir", "onnxruntime-genai's builder imports it")
    require("transformers", "the tiny model is built with transformers")


@pytest.fixture(scope="module")
def qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama's W8A16 QDQ stage for SM8750, built by edgekit's HTP builder."""
    _require_all()
    from edgekit.converters.onnx.htp_build import hf_to_htp
    from edgekit.converters.recipe import Recipe

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model("llama", tmp_path_factory.mktemp("hf"))
    out = tmp_path_factory.mktemp("htp") / "qdq"
    # a part limit of ~100 KiB splits the tiny model in two: every part gets its binaries
    recipe = Recipe(weights="W8A16").with_options("soc=SM8750,part_gib=0.0001")
    hf_to_htp(src, out, "W8A16", recipe=recipe, stop_at_qdq=True)
    return out


@pytest.fixture(scope="module")
def compiled(qdq: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    """The QDQ stage compiled for every SoC, shared and per graph."""
    from edgekit.converters.onnx.htp_compile import compile_variant
    from edgekit.converters.onnx.socs import SOCS

    root = tmp_path_factory.mktemp("ctx")
    done: dict[tuple[str, bool], Path] = {}
    for key in SOC_KEYS:
        for share in (True, False):
            out = root / f"{key}-{'shared' if share else 'graphs'}"
            warnings = compile_variant(qdq, out, SOCS[key], share=share)
            assert bool(warnings) == share  # a shared binary is not run here: said so
            done[key, share] = out
    return done


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _stages(folder: Path) -> dict[str, Any]:
    return _json(folder / "genai_config.json")["model"]["decoder"]["pipeline"][0]


# --- the compile step -----------------------------------------------------------------------


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-graph"])
@pytest.mark.parametrize("key", SOC_KEYS)
def test_the_compile_writes_epcontext_wrappers_and_binaries(
    qdq: Path, compiled: dict[tuple[str, bool], Path], key: str, share: bool
) -> None:
    import onnx
    import onnxruntime_qnn
    from edgekit.converters.onnx.socs import SOCS
    from edgekit.targets.onnx_folder import read_folder

    out, soc = compiled[key, share], SOCS[key]
    parts = _json(qdq / "edgekit.json")["htp"]["parts"]
    names = {p.name for p in out.iterdir()}
    wrappers = {f"part{i}.{p}_ctx.onnx" for i in range(parts) for p in ("prompt", "token")}
    assert wrappers <= names
    binaries = {n for n in names if n.endswith(".bin")}
    # shared: one context per part, its weights once; else one per graph
    assert len(binaries) == (parts if share else 2 * parts), sorted(names)
    assert not any(
        n.startswith("part") and n.endswith((".prompt.onnx", ".token.onnx", ".data")) for n in names
    ), "QDQ part graphs are not shipped"
    assert {"embeddings.onnx", "tokenizer.json", "genai_config.json", "edgekit.json"} <= names
    for name in wrappers:
        model = onnx.load(str(out / name))
        assert [n.op_type for n in model.graph.node] == ["EPContext"]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
        assert attrs["embed_mode"] == 0 and attrs["ep_cache_context"].decode() in binaries
    for stage, entry in _stages(out).items():
        if stage == "embeddings":
            assert "session_options" not in entry or not entry["session_options"].get(
                "provider_options"
            )
            continue
        assert entry["filename"] in wrappers
        options = entry["session_options"]
        assert options["session.disable_cpu_ep_fallback"] == "1"
        assert (options.get("ep.share_ep_contexts") == "1") == share
        qnn = options["provider_options"][0]["qnn"]
        assert qnn["backend_type"] == "htp" and qnn["soc_model"] == str(soc.soc_model)
        assert qnn["htp_arch"] == str(soc.htp_arch)
        # a compile option only: the shipped config names no path on this host
        assert "op_affinity" not in qnn and not any("/" in v for v in qnn.values())
    settings = _json(out / "edgekit.json")["htp"]
    assert settings["stage"] == "context" and settings["soc"] == key
    assert (
        settings["compiled_with"]["qnn_sdk"] == onnxruntime_qnn.build_and_package_info.qnn_version
    )
    assert settings["compiled_with"]["onnxruntime_qnn"] == onnxruntime_qnn.__version__
    assert read_folder(out).holds_ep_context()
    assert not read_folder(qdq).holds_ep_context()


def _greedy(folder: Path, prompt: list[int], n: int, *, cpu: bool) -> list[int]:
    """``n`` greedy tokens from onnxruntime-genai directly: the CPU provider, or the
    config as shipped (the QNN provider options a device loads it with)."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    if cpu:
        config.clear_providers()
    model = og.Model(config)
    window = _json(folder / "genai_config.json")["model"]["decoder"]["sliding_window"]
    size = window["window_size"]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=-(-len(prompt) // size) * size + n, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    tokens = []
    for _ in range(n):
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    del generator, model
    return tokens


def test_per_graph_binaries_run_on_the_host_simulator(
    qdq: Path, compiled: dict[tuple[str, bool], Path]
) -> None:
    """The shipped genai_config.json as a device loads it (QNN provider options, no
    op_affinity), on the x86_64 HTP simulator: the same greedy tokens as the QDQ stage on
    the CPU provider (measured on this tiny model: the first SIM_TOKENS agree; the HTP's
    fixed-point arithmetic is not the CPU's QDQ emulation, so a longer run may part)."""
    import onnxruntime as ort
    import onnxruntime_genai as og
    from edgekit.targets import qnn_host
    from edgekit.targets.qnn import QnnTarget

    qnn_host.register_with_genai(og, qnn_host.plugin(ort))
    cpu: list[int] = []
    with QnnTarget.load(qdq, device="cpu") as s:
        prompt = s.tokenize(PROMPT)
        cpu = _greedy(qdq, prompt, SIM_TOKENS, cpu=True)
        # edgekit's session makes what onnxruntime-genai makes
        assert s.generate(PROMPT, max_tokens=SIM_TOKENS, **GREEDY).text == s.detokenize(cpu)
    htp = _greedy(compiled["SM8750", False], prompt, SIM_TOKENS, cpu=False)
    assert htp == cpu


# --- the target ---------------------------------------------------------------------------------


def test_the_qdq_stage_runs_on_the_cpu_provider(qdq: Path) -> None:
    from edgekit.targets.onnx_folder import read_folder
    from edgekit.targets.qnn import QnnTarget

    window = read_folder(qdq).prompt_window
    assert window == _json(qdq / "edgekit.json")["htp"]["window"]
    assert QnnTarget.load_unit("auto", qdq) == "cpu"
    for device in ("auto", "cpu"):
        with QnnTarget.load(qdq, device=device) as s:
            assert (s.info.unit, s.info.settings["provider"]) == ("cpu", "cpu")
            g = s.generate(PROMPT, max_tokens=5, **GREEDY)
            assert g.completion_tokens == 5 and g.text
    with QnnTarget.load(qdq) as s:
        # logits of a static pipeline (last position only), position by position
        ids = s.tokenize(PROMPT)
        path = list(ids)
        for _ in range(3):
            path.append(int(s.logits(path)[-1].argmax()))
        rows = s.logits(path)
        assert rows.shape == (len(path), read_folder(qdq).vocab_size)
        assert [int(r.argmax()) for r in rows[len(ids) - 1 : -1]] == path[len(ids) :]
        assert s.generate(PROMPT, max_tokens=3, **GREEDY).text == s.detokenize(path[len(ids) :])
        # a prompt of more than one window: the padding of its last window takes positions
        long = (PROMPT + " ") * (window // len(ids) + 2)
        assert len(s.tokenize(long)) > window
        g = s.generate(long, max_tokens=4, **GREEDY)
        assert g.completion_tokens == 4


def test_the_context_stage_is_refused_on_this_host(
    compiled: dict[tuple[str, bool], Path],
) -> None:
    from edgekit.targets import qnn_host
    from edgekit.targets.qnn import QnnTarget

    if qnn_host.host_soc() is not None:
        pytest.skip("this is a Snapdragon: its HTP may run the variant")
    folder = compiled["SM8750", True]
    assert QnnTarget.load_unit("auto", folder) == "npu"
    for device in ("auto", "npu"):
        with pytest.raises(TargetUnavailableError) as info:
            QnnTarget.load(folder, device=device)
        message = info.value.message
        assert "only the HTP compiled for the Snapdragon 8 Elite (SM8750) runs it" in message
        assert "lists no NPU" in message or "no onnxruntime_qnn" in message
    with pytest.raises(TargetUnavailableError, match="only the HTP runs them"):
        QnnTarget.load(folder, device="cpu")


def test_ignore_eos_on_a_pipeline_never_picks_the_eos(qdq: Path, tmp_path: Path) -> None:
    """The QDQ stage copied with its EOS set to the token greedy decoding makes first: it
    stops at once; with ignore_eos it makes as many tokens as asked, none of them that
    EOS (a pipeline's generator takes no token after generating: min_length holds it)."""
    from edgekit.targets.qnn import QnnTarget

    with QnnTarget.load(qdq) as s:
        ids = s.tokenize(PROMPT)
        first = int(s.logits(ids)[-1].argmax())
    folder = Path(shutil.copytree(qdq, tmp_path / "qdq"))
    path = folder / "genai_config.json"
    config = _json(path)
    config["model"]["eos_token_id"] = first
    path.write_text(json.dumps(config))
    with QnnTarget.load(folder) as s:
        stopped = s.generate(PROMPT, max_tokens=4, temperature=0)
        assert (stopped.completion_tokens, stopped.finish_reason) == (0, "stop")
        going = s.generate(PROMPT, max_tokens=4, **GREEDY)
        assert (going.completion_tokens, going.finish_reason) == (4, "length")
        assert first not in s.tokenize(going.text, add_special=False)


# --- hostile QDQ folders, refused before compiling ---------------------------------------------


def _stage_file(name: str) -> Any:
    def damage(folder: Path, outside: Path) -> None:
        path = folder / "genai_config.json"
        config = _json(path)
        config["model"]["decoder"]["pipeline"][0]["part0_prompt"]["filename"] = name
        path.write_text(json.dumps(config))

    return damage


def _linked(folder: Path, outside: Path) -> None:
    shutil.copyfile(folder / "part0.prompt.onnx", outside)
    (folder / "part0.prompt.onnx").unlink()
    (folder / "part0.prompt.onnx").symlink_to(outside)


def _huge(folder: Path, outside: Path) -> None:
    config = (folder / "genai_config.json").read_text()
    (folder / "genai_config.json").write_text(config + " " * (5 << 20))


def _external_data_outside(folder: Path, outside: Path) -> None:
    import onnx

    model = onnx.load(str(folder / "part0.prompt.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../" + outside.name
    outside.write_bytes(b"\0" * 64)
    onnx.save(model, str(folder / "part0.prompt.onnx"))


def _embedding_data_named_like_a_binary(folder: Path, outside: Path) -> None:
    """The embeddings' weights renamed to the context binary the compile writes: it would
    overwrite them (the review found this compiled without a word)."""
    import onnx

    model = onnx.load(str(folder / "embeddings.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                (folder / entry.value).rename(folder / "part0.prompt_ctx_qnn.bin")
                entry.value = "part0.prompt_ctx_qnn.bin"
    onnx.save(model, str(folder / "embeddings.onnx"))


def _extra_stage(folder: Path, outside: Path) -> None:
    path = folder / "genai_config.json"
    config = _json(path)
    stages = config["model"]["decoder"]["pipeline"][0]
    stages["part9_prompt"] = dict(stages["part0_prompt"])
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_stage_file("../x.onnx"), "'../x.onnx'"),
        (_stage_file("/etc/passwd"), "'/etc/passwd'"),
        (_linked, "symbolic link"),
        (_huge, "genai_config.json"),
        (_external_data_outside, "external data"),
        (_extra_stage, "pipeline stages"),
        (_embedding_data_named_like_a_binary, "twice"),
    ],
    ids=[
        "dotdot",
        "absolute",
        "symlink",
        "huge-config",
        "external-data-outside",
        "extra-stage",
        "data-named-like-a-binary",
    ],
)
def test_a_hostile_qdq_folder_is_refused_before_compiling(
    qdq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, said: str
) -> None:
    from edgekit.converters.onnx import htp_compile
    from edgekit.converters.onnx.socs import SOCS

    folder = Path(shutil.copytree(qdq, tmp_path / "in" / "qdq", symlinks=True))
    damage(folder, tmp_path / "in" / "outside.onnx")
    ran: list[Any] = []
    monkeypatch.setattr(htp_compile, "_run_worker", lambda *a: ran.append(a))
    out = tmp_path / "out" / "ctx"
    out.parent.mkdir()
    with pytest.raises(ModelFormatError) as info:
        htp_compile.compile_variant(folder, out, SOCS["SM8750"])
    assert said in info.value.message
    assert ran == [] and os.listdir(out.parent) == []


def test_a_failing_compile_says_what_qnn_said(
    qdq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph the QNN provider cannot take (an op of a domain nobody registers): the
    worker fails, the error carries its stderr's tail, nothing is left at ``out``."""
    import onnx
    from edgekit.converters.onnx.htp_compile import compile_variant
    from edgekit.converters.onnx.socs import SOCS
    from onnx import TensorProto, helper

    folder = Path(shutil.copytree(qdq, tmp_path / "qdq"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node], "bad", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    onnx.save(model, str(folder / "part0.token.onnx"))
    out = tmp_path / "out" / "ctx"
    out.parent.mkdir()
    with pytest.raises(ConversionError) as info:
        compile_variant(folder, out, SOCS["SM8650"], share=False)
    assert "part 0" in info.value.message and "Snapdragon 8 Gen 3" in info.value.message
    assert "NoSuchOp" in info.value.hint
    assert os.listdir(out.parent) == []


def test_compile_unavailable_names_the_missing_module(
    qdq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.converters.onnx.htp_compile import compile_unavailable, compile_variant
    from edgekit.converters.onnx.socs import SOCS

    assert compile_unavailable() == ""
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # its import raises
    why = compile_unavailable()
    assert why.startswith("onnxruntime_qnn is not installed")
    out = tmp_path / "ctx"
    with pytest.raises(TargetUnavailableError, match="onnxruntime_qnn is not installed"):
        compile_variant(qdq, out, SOCS["SM8750"])
    assert not os.path.lexists(out)


@pytest.mark.parametrize(
    ("where", "key"),
    [("decoder", "enable_profiling"), ("stage", "enable_profiling"), ("provider", "backend_path")],
)
def test_session_options_outside_the_allow_list_are_refused(
    qdq: Path, tmp_path: Path, where: str, key: str
) -> None:
    """onnxruntime-genai passes session options to ONNX Runtime unchecked: a bundle's
    ``enable_profiling`` wrote profiles at the path it named on every load (the review
    found it), a QNN ``backend_path`` would load a library. The folder is refused; the
    compile does not carry the input's session options into what it ships."""
    from edgekit.targets.qnn import QnnTarget

    folder = Path(shutil.copytree(qdq, tmp_path / "qdq"))
    path = folder / "genai_config.json"
    config = _json(path)
    decoder = config["model"]["decoder"]
    section = decoder if where == "decoder" else decoder["pipeline"][0]["part0_prompt"]
    options = section.setdefault("session_options", {"provider_options": []})
    if where == "provider":
        options["provider_options"] = [{"qnn": {key: str(tmp_path / "libevil.so")}}]
    else:
        options[key] = str(tmp_path / "profile_")
    path.write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=key):
        QnnTarget.load(folder, device="cpu")
    assert not list(tmp_path.glob("profile_*"))
