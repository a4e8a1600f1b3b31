"""ONNX builds (the onnxruntime-genai model builder, CPU execution provider) of tiny random
models of every family the builder path supports, run with onnxruntime-genai directly:
FP32 greedy tokens equal transformers'; INT8 and INT4 stay within stated bounds of
transformers' next-token distributions; the layout is the files' own bytes, tensor by
tensor; what the builder cannot do is refused before anything is written; the CLI's
``--json`` output stays clean while the builder prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters import convert, graph
from edgekit.converters.onnx import FORMAT
from edgekit.converters.onnx.edges import cannot_build
from edgekit.converters.onnx.export import ARCHITECTURES, BUILDABLE, SETTINGS_FILE

from edgekit.architectures import FAMILIES
from edgekit.errors import TargetUnavailableError, UnsupportedConversionError
from edgekit.inspection import inspect_model
from tests.conftest import require
from tests.tiny_models import build_tiny_model, training_text

PROMPT = "It is a truth universally acknowledged, that a single man"
NEW_TOKENS = 16
TEXT_TOKENS = 64  # positions compared in the KL / agreement measurement
# The generator's KV capacity: Gemma 3's windowed KV cache refuses one below its sliding
# window (512 in the tiny models), so every run takes the tiny models' whole context.
MAX_LENGTH = 1024

# Bounds for the quantized builds against transformers' fp32 next-token distributions,
# teacher-forced over the first TEXT_TOKENS tokens of the shipped Austen excerpt.
# Measured on these tiny random models (hidden 64, 2 layers, vocab 512; docs/onnx.md):
# INT8 mean KL 2.2e-4 to 5.8e-4, top-1 agreement 0.89 to 1.0; INT4 mean KL 0.036 to 0.074,
# agreement 0.47 to 0.86 (random weights give flat distributions with small top-1
# margins, so 4-bit noise flips many argmaxes; real models have wider margins). The
# bounds leave 2-2.5x on KL and 0.1-0.17 on agreement. What they exclude: a build with
# wrong weights (two tiny models of different seeds: KL 1.0, agreement <= 0.02).
BOUNDS = {"INT8": (1.5e-3, 0.80), "INT4": (0.15, 0.30)}


@dataclass
class Builds:
    """Tiny sources and their ONNX builds, made once per module and only when asked."""

    root: Path
    sources: dict[str, Path] = field(default_factory=dict)
    built: dict[tuple[str, str, int | None], Path] = field(default_factory=dict)

    def source(self, family: str) -> Path:
        if family not in self.sources:
            path = build_tiny_model(family, self.root / f"{family}-hf")
            if family == "phi3":  # the Phi-3-mini-4k shape: one context, no LongRoPE
                _edit_config(path, original_max_position_embeddings=1024)
            self.sources[family] = path
        return self.sources[family]

    def onnx(self, family: str, quant: str, group_size: int | None = None) -> Path:
        key = (family, quant, group_size)
        if key not in self.built:
            out = self.root / f"{family}-{quant}-{group_size or 'default'}"
            recipe = f"group_size={group_size}" if group_size else None
            convert.convert_model(self.source(family), "onnx", out, quant=quant, recipe=recipe)
            self.built[key] = out
        return self.built[key]


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    for module in ("onnxruntime_genai", "onnx_ir", "onnx", "torch", "transformers"):
        require(module, "the ONNX build and its parity checks need it")
    yield Builds(root=tmp_path_factory.mktemp("onnx-builds"))


# --- running the two sides ---------------------------------------------------------------


def _hf_tokens(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(folder)(text)["input_ids"])


def _hf_model(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _og_model(folder: Path) -> Any:
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()  # the CPU execution provider
    return og.Model(config)


def _og_greedy(folder: Path, ids: list[int], new: int) -> list[int]:
    import onnxruntime_genai as og

    model = _og_model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out: list[int] = []
    while len(out) < new and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def _hf_greedy(folder: Path, ids: list[int], new: int, eos: Any) -> list[int]:
    import torch

    model = _hf_model(folder)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new,
            eos_token_id=eos,
            pad_token_id=model.config.pad_token_id,
        )
    return [int(t) for t in out[0, len(ids) :]]


def _og_logits(folder: Path, ids: list[int]) -> Any:
    """Next-token logits after every prefix of ``ids``, one token appended at a time."""
    import numpy as np
    import onnxruntime_genai as og

    model = _og_model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
    generator = og.Generator(model, params)
    rows = []
    for token in ids:
        generator.append_tokens([token])
        logits = np.asarray(generator.get_logits(), dtype=np.float64)
        rows.append(logits.reshape(-1, logits.shape[-1])[-1])
    return np.stack(rows)


def _hf_logits(folder: Path, ids: list[int]) -> Any:
    import numpy as np
    import torch

    with torch.no_grad():
        logits = _hf_model(folder)(torch.tensor([ids])).logits[0]
    return np.asarray(logits, dtype=np.float64)


def compare(reference: Any, other: Any) -> tuple[float, float]:
    """Mean KL(reference || other) over positions, and the share of positions whose
    top-1 token agrees."""
    import numpy as np

    def log_softmax(x: Any) -> Any:
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    p, q = log_softmax(reference), log_softmax(other)
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    agree = (reference.argmax(-1) == other.argmax(-1)).mean()
    return float(kl.mean()), float(agree)


def measure(builds: Builds, family: str, quant: str) -> tuple[float, float]:
    src = builds.source(family)
    ids = _hf_tokens(src, training_text())[:TEXT_TOKENS]
    return compare(_hf_logits(src, ids), _og_logits(builds.onnx(family, quant), ids))


def _eos(folder: Path) -> Any:
    return json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]


# --- parity and bounds -------------------------------------------------------------------

FAMILY_KEYS = sorted(BUILDABLE)


def test_every_family_edgekit_knows_is_built_by_the_builder() -> None:
    """The builder path covers every family of edgekit's table (onnxruntime-genai 0.18.0
    has a model class for each): the parity tests below run them all."""
    assert set(FAMILY_KEYS) == {f.key for f in FAMILIES}
    assert set(ARCHITECTURES.values()) == BUILDABLE
    assert all(cannot_build(family) == "" for family in FAMILY_KEYS)
    assert "no gpt2 model class" in cannot_build("gpt2")


@pytest.mark.parametrize("family", FAMILY_KEYS)
def test_fp32_greedy_tokens_equal_transformers(builds: Builds, family: str) -> None:
    import numpy as np

    src = builds.source(family)
    out = builds.onnx(family, "FP32")
    ids = _hf_tokens(src, PROMPT)
    ours = _og_greedy(out, ids, NEW_TOKENS)
    assert len(ours) >= 4, "the comparison needs tokens to compare"
    assert ours == _hf_greedy(src, ids, NEW_TOKENS, _eos(out))
    # and the distributions themselves, not only their argmax
    assert np.abs(_hf_logits(src, ids)[-1] - _og_logits(out, ids)[-1]).max() < 1e-3


@pytest.mark.parametrize("quant", ["INT8", "INT4"])
@pytest.mark.parametrize("family", FAMILY_KEYS)
def test_quantized_builds_load_generate_and_stay_within_bounds(
    builds: Builds, family: str, quant: str
) -> None:
    kl_bound, agree_bound = BOUNDS[quant]
    kl, agree = measure(builds, family, quant)
    assert kl <= kl_bound and agree >= agree_bound, (family, quant, kl, agree)
    out = builds.onnx(family, quant)
    generated = _og_greedy(out, _hf_tokens(builds.source(family), PROMPT), NEW_TOKENS)
    assert len(generated) >= 4 and all(0 <= t < 512 for t in generated)


# --- the layout is the files' own bytes --------------------------------------------------


def _initializer_bytes(folder: Path) -> dict[str, int]:
    """Every initializer of model.onnx and its bytes (dims x item size), checked against
    the length its external-data entry records."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    sizes: dict[str, int] = {}
    for t in model.graph.initializer:
        count = 1
        for d in t.dims:
            count *= d
        nbytes = count * tensor_dtype_to_np_dtype(t.data_type).itemsize
        external = {e.key: e.value for e in t.external_data}
        if "length" in external:
            assert int(external["length"]) == nbytes, t.name
        sizes[t.name] = nbytes
    return sizes


LAYOUT_CASES = [(f, q, None) for f in FAMILY_KEYS for q in ("FP32", "INT8", "INT4")] + [
    ("llama", "INT4", 128),  # a block longer than the rows (K = 64): padded to a whole block
    ("qwen2", "INT8", 16),  # tied embeddings: an f32 embedding beside the 8-bit lm_head
    ("gemma3", "INT4", 64),  # tied: the embedding shares lm_head's 4-bit blocks
]


@pytest.mark.parametrize(("family", "quant", "group"), LAYOUT_CASES)
def test_layout_is_what_the_builder_wrote(
    builds: Builds, family: str, quant: str, group: int | None
) -> None:
    out = builds.onnx(family, quant, group)
    spec = inspect_model(out)  # the variant folder, described from its config
    assert spec.parameters_source == "config" and spec.family == family
    assert json.loads((out / SETTINGS_FILE).read_text())["block_size"] == (
        None if quant == "FP32" else group or 32
    )
    layout = FORMAT.built_layout(spec, quant)
    sizes = _initializer_bytes(out)
    rest = dict(sizes)
    for t in layout.tensors:  # every matrix: its weights (and scales) exactly
        if t.name.endswith(".MatMul"):
            mine = [n for n in sizes if n.startswith(t.name + ".")]
            assert mine and sum(sizes[n] for n in mine) == t.nbytes, t.name
            for n in mine:
                del rest[n]
    others = sum(t.nbytes for t in layout.tensors if not t.name.endswith(".MatMul"))
    assert others == sum(rest.values())  # embeddings, norms, biases, RoPE caches
    assert layout.total_bytes == sum(sizes.values())
    assert (out / "model.onnx.data").stat().st_size == sum(sizes.values())
    # the layout planned from the source at the same block size is the same (the source
    # lists its tensors in the safetensors file's order, the config in the family's)
    planned = FORMAT.layout(inspect_model(builds.source(family)), quant, group_size=group)
    assert sorted(planned.tensors, key=lambda t: t.name) == sorted(
        layout.tensors, key=lambda t: t.name
    )


def test_the_format_is_buildable_and_packs_int4() -> None:
    assert FORMAT.buildable and FORMAT.pack_default() == "INT4"
    assert list(FORMAT.quants) == ["FP32", "INT8", "INT4", "W16A16", "W8A16", "FP16"]
    assert FORMAT.quants["FP32"].lossless and not FORMAT.quants["INT4"].lossless
    assert FORMAT.quants["INT4"].bits_per_weight == 5.0  # 4 bits + an f32 scale per 32
    assert [f"{e.source}->{e.output}" for e in graph.route("hf", "onnx")] == ["hf->onnx"]
    assert [f"{e.source}->{e.output}" for e in graph.route("gguf", "onnx")] == [
        "gguf->hf",
        "hf->onnx",
    ]
    assert "onnx" in graph.outputs()


# --- refused before anything is written ----------------------------------------------------

REFUSED = [
    ("Q4_K_M", None, "not an ONNX quantization"),
    ("INT4", "group_size=48", "not a block size"),
    ("INT8", "group_size=512", "not a block size"),
    ("FP32", "group_size=32", "no quantization blocks"),
    ("INT4", "embeddings=Q8_0", "cannot express embeddings=Q8_0"),
    ("INT4", "output=INT8", "cannot express output=INT8"),
    ("INT8", "ratio=0.5", "cannot express ratio=0.5"),
    ("INT4", "calibration=text.txt", "cannot express calibration"),
    ("INT4", "kv_cache=q8_0", "no equivalent in the ONNX CPU build"),
]


def _assert_nothing_written(where: Path) -> None:
    assert list(where.iterdir()) == [], "a refusal left files behind"


@pytest.mark.parametrize(("quant", "recipe", "match"), REFUSED)
def test_unsupported_quant_or_recipe_is_refused_before_writing(
    builds: Builds, tmp_path: Path, quant: str, recipe: str | None, match: str
) -> None:
    src = builds.source("llama")
    out = tmp_path / "out" / "model"
    with pytest.raises(UnsupportedConversionError, match=match):
        convert.convert_model(src, "onnx", out, quant=quant, recipe=recipe)
    assert not out.exists()
    _assert_nothing_written(tmp_path)


def test_configs_the_builder_would_misread_are_refused_before_writing(
    builds: Builds, tmp_path: Path
) -> None:
    import shutil

    phi3 = shutil.copytree(builds.source("phi3"), tmp_path / "phi3")
    _edit_config(phi3, original_max_position_embeddings=4096)  # LongRoPE, without factors
    quantized = shutil.copytree(builds.source("llama"), tmp_path / "llama")
    _edit_config(quantized, quantization_config={"quant_method": "gptq", "bits": 4})
    gemma3 = shutil.copytree(builds.source("gemma3"), tmp_path / "gemma3")
    rope = json.loads((gemma3 / "config.json").read_text())["rope_parameters"]
    rope["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    _edit_config(gemma3, rope_parameters=rope)  # Gemma 3 4B's global layers
    out = tmp_path / "outputs" / "model"
    cases = (
        (phi3, "without LongRoPE factors"),
        (quantized, "pre-quantized"),
        (gemma3, "Gemma 3 with scaled RoPE"),
    )
    for src, match in cases:
        with pytest.raises(UnsupportedConversionError, match=match):
            convert.convert_model(src, "onnx", out, quant="INT4")
        assert not out.exists() and not out.parent.exists()


def test_a_family_the_builder_lacks_is_refused_by_the_edge_check(builds: Builds) -> None:
    from dataclasses import replace

    from edgekit.converters.formats import ConvertRequest

    from edgekit.progress import no_progress

    src = builds.source("llama")
    spec = replace(inspect_model(src), family="gpt2")
    request = ConvertRequest(
        src=src, out=None, spec=spec, quant="INT4", recipe=None, progress=no_progress
    )
    with pytest.raises(UnsupportedConversionError, match="no gpt2 model class"):
        FORMAT.edges()[0].check(request)
    assert FORMAT.cannot_build(spec) != ""


def test_missing_onnxruntime_genai_is_refused_before_writing(
    builds: Builds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    src = builds.source("llama")
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "onnxruntime_genai" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    out = tmp_path / "out" / "model"
    with pytest.raises(TargetUnavailableError, match="onnxruntime_genai is not installed") as e:
        convert.convert_model(src, "onnx", out, quant="INT4")
    assert e.value.hint == "pip install 'edgekit[onnx,reference]'"
    _assert_nothing_written(tmp_path)


# --- the route from a GGUF, and the CLI -----------------------------------------------------


def test_a_gguf_reaches_onnx_through_a_hugging_face_folder(builds: Builds, tmp_path: Path) -> None:
    """GGUF F32 -> HF (dequantized) -> ONNX FP32 loses nothing: the greedy tokens are the
    original Hugging Face model's."""
    require("gguf", "writing the GGUF needs the gguf package")
    src = builds.source("llama")
    gguf = tmp_path / "tiny.gguf"
    convert.convert_model(src, "gguf", gguf, quant="F32")
    out = tmp_path / "onnx"
    result = convert.convert_model(gguf, "onnx", out, quant="FP32")
    assert result.format == "onnx" and result.quant == "FP32"
    ids = _hf_tokens(src, PROMPT)
    assert _og_greedy(out, ids, NEW_TOKENS) == _hf_greedy(src, ids, NEW_TOKENS, _eos(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx", "tiny.gguf"]  # no scratch


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # warnings must not reach stdout either
    return subprocess.run(
        [sys.executable, "-m", "edgekit", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_cli_convert_to_onnx_prints_clean_json(builds: Builds, tmp_path: Path, source: str) -> None:
    src = builds.source("llama")
    if source == "gguf":
        require("gguf", "writing the GGUF needs the gguf package")
        src = convert.convert_model(src, "gguf", tmp_path / "tiny.gguf", quant="F16").path
    work = tmp_path / "cwd"
    work.mkdir()
    out = tmp_path / "out"
    done = _cli(
        "convert", str(src), "--to", "onnx", "--quant", "INT4", "-o", str(out), "--json", cwd=work
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)  # the whole of stdout is the one JSON document
    assert (report["format"], report["quant"], report["path"]) == ("onnx", "INT4", str(out))
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    assert list(work.iterdir()) == []  # no ./cache_dir in the working directory
    assert "Saving" not in done.stderr  # the builder's progress bars went to the debug log


def test_the_variant_keeps_the_source_tokenizer_when_the_builder_would_rebuild_it(
    builds: Builds, tmp_path: Path
) -> None:
    """transformers rebuilds tokenizer.json from the class tokenizer_config.json names when
    the builder re-saves it: a byte-level BPE vocabulary under a SentencePiece class
    (SmolLM2 exported from its GGUF names CodeLlamaTokenizer) came out Metaspace. The
    variant ships the source's own tokenizer files."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(builds.source("llama"), src)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "CodeLlamaTokenizer"
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "int4"
    convert.convert_model(src, "onnx", out, quant="INT4")
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert json.loads((out / "tokenizer.json").read_text())["pre_tokenizer"] == json.loads(
        (src / "tokenizer.json").read_text()
    )["pre_tokenizer"]


def test_cli_convert_to_an_htp_variant_prints_clean_json(builds: Builds, tmp_path: Path) -> None:
    """ONNX Runtime's QDQ quantizer warns on the root logger ("failed to infer the type of
    tensor", "consider pre-processing"): none of it reaches the terminal."""
    require("onnxruntime_qnn", "the HTP variant is compiled with onnxruntime-qnn")
    out = tmp_path / "htp"
    done = _cli(
        "convert", str(builds.source("llama")), "--to", "onnx", "--quant", "W16A16",
        "--recipe", "soc=SM8650", "-o", str(out), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert (report["format"], report["quant"]) == ("onnx", "W16A16")
    assert "WARNING" not in done.stderr and "pre-processing" not in done.stderr, done.stderr
    assert "CleanUnusedInitializers" not in done.stderr, done.stderr
    assert json.loads((out / "edgekit.json").read_text())["htp"]["stage"] == "context"
