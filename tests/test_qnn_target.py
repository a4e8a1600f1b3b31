"""The ONNX Runtime GenAI target (targets/qnn.py): which execution provider runs, refusals
of the NPU without the QNN provider, the onnxruntime-qnn plug-in's registration when it is
absent or broken, folders refused before ONNX Runtime opens them, ignore_eos past an
end-of-sequence token, and what the probe says.

The contract suite (tests/contract/) covers generation, streaming, cancel, close and logits.
The variants here are FP32 builds of tiny random models by edgekit's converter
(onnxruntime-genai's model builder, CPU execution provider).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from edgekit.errors import (
    ModelFormatError,
    ModelNotFoundError,
    SettingError,
    TargetUnavailableError,
)
from tests.conftest import require

PROMPT = "It is a truth universally acknowledged, that a single man"
GREEDY: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}


def _built(family: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random model of ``family`` (its Hugging Face folder) and its FP32 ONNX
    variant (edgekit's converter: onnxruntime-genai's builder, CPU)."""
    require("onnxruntime_genai", "the target runs onnxruntime-genai")
    require("onnx_ir", "onnxruntime-genai's builder imports it")
    require("transformers", "the tiny model is built with transformers")
    from edgekit.converters.convert import convert_model
    from edgekit.targets.qnn import QnnTarget

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model(family, tmp_path_factory.mktemp(f"hf-{family}"))
    out = tmp_path_factory.mktemp(f"onnx-{family}") / "variant"
    convert_model(src, QnnTarget.format.name, out, quant="FP32")
    return src, out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama as onnxruntime-genai's builder writes it."""
    return _built("llama", tmp_path_factory)[1]


@pytest.fixture
def copy(folder: Path, tmp_path: Path) -> Path:
    """A copy of the variant a test may damage."""
    return Path(shutil.copytree(folder, tmp_path / "variant"))


@pytest.fixture
def no_plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """onnxruntime-qnn absent (whether or not it is installed), registration forgotten."""
    from edgekit.targets import qnn_host

    qnn_host.forget_registration()
    monkeypatch.setitem(sys.modules, qnn_host.PLUGIN_MODULE, None)  # import raises
    yield qnn_host
    qnn_host.forget_registration()


def _edit_config(folder: Path, edit: Any) -> None:
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def _never_opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every folder onnxruntime-genai is asked to open (none, for a refusal)."""
    import onnxruntime_genai as og

    opened: list[str] = []
    monkeypatch.setattr(og, "Config", lambda path: opened.append(path))
    return opened


# --- which provider runs ------------------------------------------------------------------------


def test_the_cpu_provider_runs_here_and_says_so(folder: Path, no_plugin: Any) -> None:
    from edgekit.targets.qnn import QnnTarget

    for device in ("auto", "cpu"):
        with QnnTarget.load(folder, device=device) as s:
            assert s.info.unit == "cpu"
            assert s.info.settings["provider"] == "cpu"
            assert s.info.settings["execution_provider"] == "CPUExecutionProvider"
            assert s.info.kv_cache == "f32" and s.info.vocab_size == 512
            assert s.generate(PROMPT, max_tokens=4, **GREEDY).completion_tokens == 4
    assert QnnTarget.load_unit("auto") == "cpu"
    assert QnnTarget.load_unit("auto", folder) == "cpu"
    assert QnnTarget.load_unit("npu") == "npu"


def test_threads_and_context_are_applied_and_checked(folder: Path) -> None:
    from edgekit.targets.qnn import QnnTarget

    with QnnTarget.load(folder, threads=1, context=64) as s:
        assert (s.info.threads, s.info.context_length) == (1, 64)
        g = s.generate(PROMPT, max_tokens=500, **GREEDY)
        assert g.completion_tokens == 64 - g.prompt_tokens and g.finish_reason == "length"


@pytest.mark.parametrize(
    "settings",
    [
        {"threads": 0},
        {"threads": 10**6},
        {"context": 10**9},  # the model was exported for 1024
        {"context": "big"},
        {"device": "gpu"},
        {"logits": "yes"},
        {"kv_cache": "f16"},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_settings_are_checked_before_the_runtime_sees_them(
    folder: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    from edgekit.targets.qnn import QnnTarget

    opened = _never_opened(monkeypatch)
    with pytest.raises(SettingError):
        QnnTarget.load(folder, **settings)
    assert opened == []


# --- the NPU and the QNN plug-in ----------------------------------------------------------------


def test_the_npu_without_the_qnn_provider_is_refused(
    folder: Path, no_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.targets.qnn import QnnTarget

    opened = _never_opened(monkeypatch)
    with pytest.raises(TargetUnavailableError) as info:
        QnnTarget.load(folder, device="npu")
    assert "QNNExecutionProvider" in info.value.message
    assert "no onnxruntime_qnn" in info.value.message
    assert "device='cpu'" in info.value.hint
    assert opened == []


def _make_context_binary_variant(folder: Path) -> None:
    """``folder`` turned into what a context-binary variant looks like: a genai config
    naming the QNN provider for a SoC, and a graph that is one EPContext node."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(
        "EPContext",
        ["input_ids"],
        ["logits"],
        domain="com.microsoft",
        embed_mode=0,
        ep_cache_context="model_ctx.bin",
        source="QNNExecutionProvider",
    )
    graph = helper.make_graph(
        [node],
        "ctx",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, 128])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 128, 512])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(model, str(folder / "model_ctx.onnx"))
    (folder / "model_ctx.bin").write_bytes(b"\0" * 64)

    def edit(config: dict[str, Any]) -> None:
        decoder = config["model"]["decoder"]
        decoder["filename"] = "model_ctx.onnx"
        decoder["session_options"]["provider_options"] = [
            {"qnn": {"backend_type": "htp", "soc_model": "69", "htp_arch": "79"}}
        ]

    _edit_config(folder, edit)


def test_a_context_binary_variant_runs_only_on_the_htp(
    copy: Path, no_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("onnx", "the test writes an EPContext graph")
    from edgekit.targets.onnx_folder import read_folder
    from edgekit.targets.qnn import QnnTarget

    assert not read_folder(copy).holds_ep_context()  # the builder's graph is no EPContext
    _make_context_binary_variant(copy)
    checked = read_folder(copy)
    assert checked.holds_ep_context() and checked.names_provider("qnn")
    assert checked.provider_options["qnn"]["soc_model"] == "69"
    opened = _never_opened(monkeypatch)
    for device in ("auto", "npu"):
        with pytest.raises(TargetUnavailableError, match="QNNExecutionProvider"):
            QnnTarget.load(copy, device=device)
    with pytest.raises(TargetUnavailableError, match="only the HTP runs them"):
        QnnTarget.load(copy, device="cpu")
    assert opened == []


def test_the_plugin_absent_is_reported_not_raised(no_plugin: Any) -> None:
    import onnxruntime as ort
    from edgekit.targets.qnn import QnnTarget

    found = no_plugin.plugin(ort)
    assert (found.installed, found.registered) == (False, False)
    assert not no_plugin.qnn_present(ort)
    usable, detail = QnnTarget.check_host()
    assert usable
    assert "CPUExecutionProvider" in detail and "no onnxruntime_qnn" in detail
    assert "no QNN HTP here" in detail
    assert all(d.device != "HTP" for d in QnnTarget.host_devices())


@pytest.mark.parametrize("library", ["missing", "junk"])
def test_a_plugin_with_a_bad_library_is_refused_cleanly(
    folder: Path, tmp_path: Path, no_plugin: Any, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    """A fake onnxruntime-qnn whose library is not there, or is not a library: ONNX
    Runtime's refusal is reported, the CPU provider still runs, the NPU is refused."""
    import onnxruntime as ort
    from edgekit.targets.qnn import QnnTarget

    path = tmp_path / "libonnxruntime_providers_qnn.so"
    if library == "junk":
        path.write_bytes(b"not a shared library\n" * 8)
    fake = types.ModuleType(no_plugin.PLUGIN_MODULE)
    fake.__version__ = "2.7.0"  # type: ignore[attr-defined]
    fake.build_and_package_info = types.SimpleNamespace(qnn_version="2.51.0")  # type: ignore[attr-defined]
    fake.get_library_path = lambda: str(path)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, no_plugin.PLUGIN_MODULE, fake)
    found = no_plugin.plugin(ort)
    assert found.installed and not found.registered
    assert found.library == str(path) and found.qnn_sdk == "2.51.0"
    assert ("is not a file" if library == "missing" else "Failed to load") in found.why
    _, detail = QnnTarget.check_host()
    assert "onnxruntime_qnn 2.7.0, QNN SDK 2.51.0: not registered" in detail
    with pytest.raises(TargetUnavailableError, match="not registered"):
        QnnTarget.load(folder, device="npu")
    with QnnTarget.load(folder) as s:
        assert s.info.settings["provider"] == "cpu"


def test_a_real_plugin_registers_and_finds_no_htp_off_a_snapdragon(folder: Path) -> None:
    """With onnxruntime-qnn installed (not in this project's environment), on a host that
    is not a Snapdragon: it registers, carries its QNN SDK, lists no NPU, and the NPU is
    refused saying so."""
    import importlib.util

    from edgekit.targets import qnn_host
    from edgekit.targets.qnn import QnnTarget

    if importlib.util.find_spec(qnn_host.PLUGIN_MODULE) is None:
        pytest.skip("onnxruntime-qnn is not installed here")
    if qnn_host.host_soc() is not None:
        pytest.skip("this is a Snapdragon: the HTP may be present")
    import onnxruntime as ort

    qnn_host.forget_registration()
    found = qnn_host.plugin(ort)
    assert found.registered and found.qnn_sdk, found
    assert not qnn_host.qnn_present(ort)
    with pytest.raises(TargetUnavailableError, match="lists no NPU"):
        QnnTarget.load(folder, device="npu")


def test_the_htp_arch_is_read_on_a_snapdragon(tmp_path: Path) -> None:
    from edgekit.targets import qnn_host

    assert qnn_host.host_soc(tmp_path) is None  # not a Snapdragon (no soc0)
    soc0 = tmp_path / qnn_host.SOC_FILE
    soc0.parent.mkdir(parents=True)
    soc0.write_text("SM8750\n")
    soc = qnn_host.host_soc(tmp_path)
    assert soc is not None and (soc.htp_arch, soc.soc_model) == (79, 69)
    soc0.write_text("SM6125\n")
    assert qnn_host.host_soc(tmp_path) is None


# --- folders refused before ONNX Runtime opens them ------------------------------------------


def _set(path: tuple[str, ...], value: Any) -> Any:
    def edit(config: dict[str, Any]) -> None:
        here = config
        for key in path[:-1]:
            here = here[key]
        here[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda f: (f / "genai_config.json").write_text("{not json"), "genai_config.json"),
        (lambda f: (f / "genai_config.json").unlink(), "genai_config.json"),
        (lambda f: (f / "model.onnx").unlink(), "model.onnx"),
        (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json"),
        (lambda f: _edit_config(f, _set(("model", "decoder", "filename"), "../x.onnx")), "x.onnx"),
        (lambda f: _edit_config(f, _set(("model", "vocab_size"), 10**9)), "vocab_size"),
        (lambda f: _edit_config(f, _set(("model", "context_length"), -1)), "context_length"),
        (lambda f: _edit_config(f, _set(("model", "eos_token_id"), 512)), "eos_token_id"),
        (lambda f: _edit_config(f, _set(("model", "decoder"), [])), "model.decoder"),
    ],
    ids=[
        "not-json",
        "no-config",
        "no-model-onnx",
        "no-tokenizer",
        "escaping-filename",
        "huge-vocab",
        "negative-context",
        "eos-past-vocab",
        "decoder-not-object",
    ],
)
def test_a_damaged_folder_is_refused_before_onnx_runtime_sees_it(
    copy: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, said: str
) -> None:
    from edgekit.targets.qnn import QnnTarget

    damage(copy)
    opened = _never_opened(monkeypatch)
    with pytest.raises(ModelFormatError, match=said.replace(".", r"\.")):
        QnnTarget.load(copy)
    assert opened == []


def test_a_linked_model_file_is_refused(copy: Path, tmp_path: Path) -> None:
    from edgekit.targets.qnn import QnnTarget

    outside = tmp_path / "elsewhere.onnx"
    (copy / "model.onnx").rename(outside)
    (copy / "model.onnx").symlink_to(outside)
    with pytest.raises(ModelFormatError, match="model.onnx"):
        QnnTarget.load(copy)
    with pytest.raises(ModelNotFoundError):
        QnnTarget.load(tmp_path / "missing")


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("model", "decoder", "outputs", "present_key_names"), "%s", "'%s'"),
        (("model", "decoder", "inputs", "past_key_names"), "past.%d.%d", "past.%d.%d"),
        (("model", "decoder", "session_options", "custom_ops_library"), "x.so", "custom_ops"),
    ],
    ids=["format-s-crashes-genai", "two-conversions", "custom-ops-library"],
)
def test_what_onnxruntime_genai_acts_on_unchecked_is_refused(
    copy: Path, monkeypatch: pytest.MonkeyPatch, path: tuple[str, ...], value: str, said: str
) -> None:
    """onnxruntime-genai formats the KV names with C's printf (``%s`` crashed the process)
    and loads a custom_ops_library from any path: both refused before it opens the folder."""
    from edgekit.targets.qnn import QnnTarget

    _edit_config(copy, _set(path, value))
    opened = _never_opened(monkeypatch)
    with pytest.raises(ModelFormatError, match=re.escape(said)):
        QnnTarget.load(copy)
    assert opened == []


# --- generation details the contract does not pin ---------------------------------------------


def test_ignore_eos_goes_on_past_an_end_of_sequence_token(folder: Path, copy: Path) -> None:
    """The variant copied with its EOS set to the token greedy decoding makes first: it
    then stops at once, and with ignore_eos makes the same tokens as the original."""
    from edgekit.targets.qnn import QnnTarget

    with QnnTarget.load(folder) as s:
        prompt = s.tokenize(PROMPT)
        path = list(prompt)
        for _ in range(6):
            path.append(int(s.logits(path)[-1].argmax()))
        expected = s.generate(PROMPT, max_tokens=6, **GREEDY)
    first = path[len(prompt)]
    _edit_config(copy, _set(("model", "eos_token_id"), first))
    with QnnTarget.load(copy) as s:
        stopped = s.generate(PROMPT, max_tokens=6, temperature=0)
        assert (stopped.completion_tokens, stopped.finish_reason) == (0, "stop")
        assert s.generate(PROMPT, max_tokens=6, **GREEDY) == expected


def test_min_p_keeps_only_likely_tokens(folder: Path) -> None:
    """min_p=1 leaves only the top token: sampling at any temperature is then greedy."""
    from edgekit.targets.qnn import QnnTarget

    with QnnTarget.load(folder) as s:
        greedy = s.generate(PROMPT, max_tokens=12, **GREEDY)
        hot = s.generate(
            PROMPT, max_tokens=12, temperature=5.0, top_k=0, min_p=1.0, seed=1, ignore_eos=True
        )
        assert hot.text == greedy.text
        loose = s.generate(
            PROMPT, max_tokens=12, temperature=5.0, top_k=0, min_p=0.0, seed=1, ignore_eos=True
        )
        assert loose.text != greedy.text


TEXTS = (PROMPT, "Café, naïve, Kraków.  Two  spaces\n\nand 12345 digits", " leading space", "x")


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma3"])
def test_token_ids_equal_transformers(
    tmp_path_factory: pytest.TempPathFactory, family: str
) -> None:
    """BOS where the family's tokenizer adds it (Mistral, Gemma 3: SentencePiece-style;
    Qwen2: none), with and without special tokens, whitespace runs merged as transformers
    merges them (onnxruntime-genai's own tokenizer does not, for Mistral), and decoded
    back as transformers decodes (the Llama 3 layout is the contract suite's)."""
    from edgekit.targets.qnn import QnnTarget
    from transformers import AutoTokenizer

    src, out = _built(family, tmp_path_factory)
    reference = AutoTokenizer.from_pretrained(src)
    with QnnTarget.load(out) as s:
        for text in TEXTS:
            assert s.tokenize(text) == reference(text)["input_ids"], text
            plain = reference(text, add_special_tokens=False)["input_ids"]
            assert s.tokenize(text, add_special=False) == plain, text
            assert s.detokenize(plain) == reference.decode(plain, skip_special_tokens=True)
        # the streamed text is the detokenized tokens (no leading space added)
        prompt = s.tokenize(PROMPT)
        path = list(prompt)
        for _ in range(8):
            path.append(int(s.logits(path)[-1].argmax()))
        streamed = "".join(c.text for c in s.stream(PROMPT, max_tokens=8, **GREEDY))
        assert streamed == s.detokenize(path[len(prompt) :])


# --- the probe ----------------------------------------------------------------------------------


def test_the_probe_lists_the_target_and_its_providers(no_plugin: Any) -> None:
    from edgekit.targets.availability import target_status
    from edgekit.targets.qnn import QnnTarget

    from edgekit.probe import probe_host

    status = target_status(QnnTarget)
    assert status.installed and status.usable
    assert "providers: " in status.detail and "CPUExecutionProvider" in status.detail
    report = probe_host()
    listed = {t.name: t for t in report.targets}
    assert listed[QnnTarget.name].usable and QnnTarget.name in report.profile.targets
    assert "CPUExecutionProvider" in listed[QnnTarget.name].detail
