"""MLX builds (mlx-lm in-process, the CPU build of mlx here) of tiny random models of every
family, run with mlx-lm directly: F32 greedy tokens equal transformers'; 8BIT and 4BIT
stay within stated bounds of transformers' next-token distributions; mixed recipes write
the bits they claim, read back from the safetensors headers and config.json; the layout
is the files' own bytes; every refusal comes before anything is written; the tokenizer
files are the source's, byte for byte; mlx-lm's chatter stays off the terminal; the
variant runs under ``python -m mlx_lm generate`` unchanged."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from edgekit.converters import convert
from edgekit.converters.edge_checks import HF_SIDE_FILES
from edgekit.converters.formats import ConvertRequest
from edgekit.converters.mlx import FORMAT
from edgekit.converters.mlx.edges import EDGES, MLX_FAMILIES, cannot_build
from edgekit.converters.mlx.export import SETTINGS_FILE

from edgekit.errors import UnsupportedConversionError
from edgekit.inspection import inspect_model
from edgekit.progress import no_progress
from edgekit.safetensors_header import read_folder_tensors
from tests.conftest import require
from tests.tiny_models import FAMILIES, build_tiny_model, training_text

PROMPT = "It is a truth universally acknowledged, that a single man"
NEW_TOKENS = 16
TEXT_TOKENS = 64  # positions compared in the KL / agreement measurement
# mlx-lm's gemma3_text has a global layer every sixth (sliding_window_pattern): a tiny
# Gemma 3 gets six layers, so its pattern (transformers' default) is one mlx-lm runs.
LAYERS = {"gemma3": 6}

# Bounds for the quantized builds against transformers' fp32 next-token distributions,
# teacher-forced over the first TEXT_TOKENS tokens of the shipped Austen excerpt, on these
# tiny random models (hidden 64, 2 layers (Gemma 3: 6), vocab 512, f32: so are the
# variants' scales). Measured here, every family: F32 KL below 1e-12 (the parity
# reference); 8BIT mean KL 1.6e-4 to 3.5e-4, top-1 agreement 0.91 to 0.97; 4BIT mean KL
# 0.045 to 0.095, agreement 0.41 to 0.61 (random weights give flat distributions with
# small top-1 margins, so 4-bit noise flips many argmaxes; real models have wider
# margins). The bounds leave about 3x on KL and 0.1 on agreement; what they exclude is
# shown by test_bounds_reject_wrong_weights (another seed's weights: KL ~1, agreement ~0).
BOUNDS = {"8BIT": (1e-3, 0.80), "4BIT": (0.25, 0.30)}


@dataclass
class Builds:
    """Tiny sources and their MLX builds, made once per module and only when asked."""

    root: Path
    sources: dict[tuple[str, int, int], Path] = field(default_factory=dict)
    built: dict[tuple[str, str, str | None, int], Path] = field(default_factory=dict)

    def source(self, family: str, layers: int = 0, seed: int = 0) -> Path:
        layers = layers or LAYERS.get(family, 2)
        key = (family, layers, seed)
        if key not in self.sources:
            out = self.root / f"{family}-l{layers}-s{seed}-hf"
            self.sources[key] = build_tiny_model(family, out, layers=layers, seed=seed)
        return self.sources[key]

    def mlx(self, family: str, quant: str, recipe: str | None = None, layers: int = 0) -> Path:
        key = (family, quant, recipe, layers)
        if key not in self.built:
            out = self.root / f"{family}-l{layers}-{quant}-{len(self.built)}"
            convert.convert_model(
                self.source(family, layers), "mlx", out, quant=quant, recipe=recipe
            )
            self.built[key] = out
        return self.built[key]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    for module in ("mlx", "mlx_lm", "torch", "transformers"):
        require(module, "the MLX build and its parity checks need it")
    yield Builds(root=tmp_path_factory.mktemp("mlx-builds"))


# --- running the two sides ---------------------------------------------------------------


def _hf_tokens(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(folder)(text)["input_ids"])


def _hf_logits(folder: Path, ids: list[int]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _mlx_logits(folder: Path, ids: list[int]) -> Any:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    return np.array(logits)


def _greedy(logits_of: Any, ids: list[int], new: int) -> list[int]:
    """Greedy tokens by a full forward pass per step (no cache: the tokens depend on the
    weights and the model class alone)."""
    seq = list(ids)
    for _ in range(new):
        seq.append(int(logits_of(seq)[-1].argmax()))
    return seq[len(ids) :]


def _hf_greedy(folder: Path, ids: list[int], new: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def logits(seq: list[int]) -> Any:
        with torch.no_grad():
            return model(torch.tensor([seq])).logits[0].numpy()

    return _greedy(logits, ids, new)


def _mlx_greedy(folder: Path, ids: list[int], new: int) -> list[int]:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    return _greedy(lambda seq: np.array(model(mx.array([seq]))[0]), ids, new)


def kl_and_agreement(reference: Any, other: Any) -> tuple[float, float]:
    """Mean KL(reference || other) per position (nats) and top-1 agreement."""
    import numpy as np

    def log_softmax(x: Any) -> Any:
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    p, q = log_softmax(reference), log_softmax(other)
    kl = (np.exp(p) * (p - q)).sum(axis=-1).mean()
    agree = (reference.argmax(-1) == other.argmax(-1)).mean()
    return float(kl), float(agree)


# --- parity -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_f32_greedy_tokens_equal_transformers(builds: Builds, family: str) -> None:
    src = builds.source(family)
    ids = _hf_tokens(src, PROMPT)
    expected = _hf_greedy(src, ids, NEW_TOKENS)
    got = _mlx_greedy(builds.mlx(family, "F32"), ids, NEW_TOKENS)
    assert got == expected


@pytest.mark.parametrize("quant", sorted(BOUNDS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_quantized_within_bounds(builds: Builds, family: str, quant: str) -> None:
    src = builds.source(family)
    ids = _hf_tokens(src, training_text())[:TEXT_TOKENS]
    kl, agree = kl_and_agreement(_hf_logits(src, ids), _mlx_logits(builds.mlx(family, quant), ids))
    max_kl, min_agree = BOUNDS[quant]
    assert kl <= max_kl and agree >= min_agree, (family, quant, kl, agree)
    assert kl > 0.0  # it is quantized: a KL of exactly 0 would mean the float weights


def test_bounds_reject_wrong_weights(builds: Builds) -> None:
    """The bounds can fail: another seed's weights, unquantized, are far outside them."""
    src = builds.source("llama")
    other = builds.source("llama", seed=1)
    out = builds.root / "llama-seed1-F32"
    convert.convert_model(other, "mlx", out, quant="F32")
    ids = _hf_tokens(src, training_text())[:TEXT_TOKENS]
    kl, agree = kl_and_agreement(_hf_logits(src, ids), _mlx_logits(out, ids))
    assert kl > 3 * BOUNDS["4BIT"][0] and agree < BOUNDS["4BIT"][1], (kl, agree)


# --- what the files hold -------------------------------------------------------------------


def _headers(folder: Path) -> dict[str, dict[str, Any]]:
    """Every tensor's header entry (dtype, shape, data_offsets), read straight from the
    safetensors files (not through edgekit's reader)."""
    import struct

    entries: dict[str, dict[str, Any]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        entries.update(header)
    return entries


def _file_bits(folder: Path, hidden: dict[str, int]) -> dict[str, int]:
    """Bits of every quantized module from its packed weight: uint32 columns =
    in * bits / 32, with ``hidden`` the logical input width of each module."""
    headers = _headers(folder)
    bits: dict[str, int] = {}
    for name, entry in headers.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{module}.scales" in headers:
            assert entry["dtype"] == "U32", name
            bits[module] = entry["shape"][-1] * 32 // hidden[module]
    return bits


def _config_bits(folder: Path, modules: list[str]) -> dict[str, int]:
    """Bits config.json records per module (a per-module entry, else the default)."""
    block = json.loads((folder / "config.json").read_text())["quantization"]
    headers = _headers(folder)
    out: dict[str, int] = {}
    for module in modules:
        entry = block.get(module)
        if isinstance(entry, dict):
            out[module] = entry["bits"]
        elif entry is not False and f"{module}.scales" in headers:
            out[module] = block["bits"]
    return out


def _logical_widths(src: Path) -> dict[str, int]:
    return {
        name.removesuffix(".weight"): entry["shape"][-1]
        for name, entry in _headers(src).items()
        if len(entry["shape"]) == 2
    }


# 8 layers: the mixed rule's sensitive layers are the first and last eighth (0, 7) and
# every third from layers // 8 = 1 on ((i - 1) % 3 == 2: 3, 6), written out here by hand
SENSITIVE_OF_8 = {0, 3, 6, 7}


def _expected_mixed(widths: dict[str, int], low: int, high: int) -> dict[str, int]:
    expected: dict[str, int] = {}
    for module in widths:
        layer = int(module.split(".")[2]) if ".layers." in module else None
        sensitive = layer in SENSITIVE_OF_8 and ("v_proj" in module or "down_proj" in module)
        expected[module] = high if sensitive or module == "lm_head" else low
    return expected


@pytest.mark.parametrize(
    ("quant", "recipe", "expected_of"),
    [
        ("MIXED_4_6", None, lambda w: _expected_mixed(w, 4, 6)),
        ("MIXED_3_6", None, lambda w: _expected_mixed(w, 3, 6)),
        (
            "4BIT",
            "embeddings=8BIT,output=6BIT",
            lambda w: {m: 8 if "embed_tokens" in m else 6 if m == "lm_head" else 4 for m in w},
        ),
        # ratio 0.75 of 8 layers: 2 at 8 bits, the most sensitive first: 0 and 7 (the ends)
        (
            "4BIT",
            "ratio=0.75",
            lambda w: {m: 8 if ".layers.0." in m or ".layers.7." in m else 4 for m in w},
        ),
    ],
)
def test_mixed_recipes_write_the_bits_they_claim(
    builds: Builds, quant: str, recipe: str | None, expected_of: Any
) -> None:
    src = builds.source("llama", layers=8)
    out = builds.mlx("llama", quant, recipe, layers=8)
    widths = _logical_widths(src)
    expected = expected_of(widths)
    assert _file_bits(out, widths) == expected
    assert _config_bits(out, list(widths)) == expected
    settings = json.loads((out / SETTINGS_FILE).read_text())
    counted: dict[str, int] = {}
    for bits in expected.values():
        counted[f"{bits}BIT/g64"] = counted.get(f"{bits}BIT/g64", 0) + 1
    assert settings["modules"] == dict(sorted(counted.items()))
    _mlx_logits(out, [1, 2, 3])  # and mlx-lm loads it as written


def test_group_size_reaches_the_files(builds: Builds) -> None:
    src = builds.source("qwen3")
    out = builds.mlx("qwen3", "4BIT", "group_size=32")
    headers = _headers(out)
    width = _logical_widths(src)["model.layers.0.mlp.down_proj"]
    assert headers["model.layers.0.mlp.down_proj.scales"]["shape"][-1] == width // 32
    assert json.loads((out / "config.json").read_text())["quantization"]["group_size"] == 32


def _data_bytes(folder: Path) -> int:
    return sum(e["data_offsets"][1] - e["data_offsets"][0] for e in _headers(folder).values())


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("quant", ["F32", "4BIT", "MIXED_4_6"])
def test_layout_is_the_files_bytes(builds: Builds, family: str, quant: str) -> None:
    """The planned layout (from the source's tensors) and the built one (from the
    variant's config and headers) both weigh what the files hold, to the byte."""
    src = builds.source(family)
    out = builds.mlx(family, quant)
    data = _data_bytes(out)
    assert FORMAT.layout(inspect_model(src), quant).total_bytes == data
    variant = dataclasses.replace(
        inspect_model(src), path=str(out), tensors=read_folder_tensors(out)
    )
    built = FORMAT.built_layout(variant, quant)
    assert built.total_bytes == data
    if quant != "F32":
        assert any(t.storage.startswith("4BIT/") for t in built.tensors)


def test_recipe_layout_matches_the_files(builds: Builds) -> None:
    out = builds.mlx("llama", "4BIT", "embeddings=8BIT,output=6BIT", layers=8)
    variant = dataclasses.replace(
        inspect_model(builds.source("llama", layers=8)),
        path=str(out),
        tensors=read_folder_tensors(out),
    )
    built = {t.name: t.storage for t in FORMAT.built_layout(variant, "4BIT").tensors}
    assert built["model.embed_tokens.weight"] == "8BIT/g64"
    assert built["lm_head.weight"] == "6BIT/g64"
    assert FORMAT.built_layout(variant, "4BIT").total_bytes == _data_bytes(out)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_variant_holds_the_sources_files_byte_for_byte(builds: Builds, family: str) -> None:
    src, out = builds.source(family), builds.mlx(family, "4BIT")
    copied = [n for n in HF_SIDE_FILES if (src / n).is_file()]
    assert "tokenizer.json" in copied
    for name in copied:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    extra = {p.name for p in out.iterdir()} - set(copied)
    assert extra == {
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        SETTINGS_FILE,
    }
    settings = json.loads((out / SETTINGS_FILE).read_text())
    assert settings["quant"] == "4BIT" and settings["kv_cache"] == "f16"


# --- refusals, before anything is written ----------------------------------------------------


REFUSED = [
    ("llama", "4BIT", "group_size=48", "group_size=48"),
    ("llama", "4BIT", "group_size=256", "group_size=256"),
    ("llama", "4BIT", "group_size=0", "group_size=0"),  # 0 is not "unset"
    ("llama", "4BIT", "soc=SM8750", "soc=SM8750"),
    ("llama", "8BIT", "part_gib=2", "part_gib=2.0"),
    ("llama", "4BIT", "kv_cache=q5_0", "q5_0"),
    ("llama", "4BIT", "kv_cache=f32", "f32"),
    ("llama", "4BIT", "embeddings=Q8_0", "embeddings=Q8_0"),
    ("llama", "4BIT", "ratio=1.5", "ratio=1.5"),
    ("llama", "4BIT", "ratio=0", "ratio=0.0"),
    ("llama", "8BIT", "calibration=CALIB", "8BIT"),
    ("llama", "4BIT", "calibration=CALIB,ratio=0.5", "ratio=0.5"),
    ("llama", "4BIT", "calibration=MISSING", "does not exist"),
    ("llama", "4BIT", "calibration=FOLDER", "a folder, not a regular file"),
    ("llama", "4BIT", "calibration=FIFO", "a FIFO, not a regular file"),
    ("phi3", "4BIT", "calibration=CALIB", "phi3"),
    ("qwen2", "4BIT", "embeddings=8BIT,output=4BIT", "tied"),  # one tensor, two pins
    ("llama", "Q4_K_M", None, "Q4_K_M"),
]


@pytest.mark.parametrize(("family", "quant", "recipe", "said"), REFUSED)
def test_refusals_come_before_anything_is_written(
    builds: Builds, tmp_path: Path, family: str, quant: str, recipe: str | None, said: str
) -> None:
    import os

    calibration = tmp_path / "calibration.txt"
    calibration.write_text(training_text())
    os.mkfifo(tmp_path / "fifo")
    if recipe:
        recipe = (
            recipe.replace("CALIB", str(calibration))
            .replace("MISSING", str(tmp_path / "none.txt"))
            .replace("FOLDER", str(tmp_path))
            .replace("FIFO", str(tmp_path / "fifo"))
        )
    src = builds.source(family)
    root = tmp_path / "out"
    root.mkdir()
    with pytest.raises(UnsupportedConversionError) as refused:
        convert.convert_model(src, "mlx", root / "variant", quant=quant, recipe=recipe)
    assert said in str(refused.value)
    assert refused.value.hint
    assert list(root.iterdir()) == []


def test_an_unchecked_family_is_refused(builds: Builds) -> None:
    src = builds.source("llama")
    spec = dataclasses.replace(inspect_model(src), family="falcon")
    assert cannot_build("falcon") and not any(cannot_build(f) for f in MLX_FAMILIES)
    request = ConvertRequest(
        src=src, out=None, spec=spec, quant="4BIT", recipe=None, progress=no_progress
    )
    with pytest.raises(UnsupportedConversionError, match="falcon"):
        EDGES[0].check(request)


def test_a_gemma3_pattern_mlx_lm_cannot_run_is_refused(builds: Builds, tmp_path: Path) -> None:
    """Two sliding layers and no global one: mlx-lm's gemma3_text would index past its
    layers (its pattern is every n-th layer global)."""
    src = builds.source("gemma3", layers=2)
    with pytest.raises(UnsupportedConversionError, match="layer types"):
        convert.convert_model(src, "mlx", tmp_path / "variant", quant="F32")
    assert not (tmp_path / "variant").exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [({"model_file": "evil.py"}, "model_file"), ({"quantization_config": {}}, "quantization")],
)
def test_a_source_config_mlx_lm_would_misread_is_refused(
    builds: Builds, tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(builds.source("llama"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    (src / "evil.py").write_text("raise SystemExit('ran the source code')\n")
    with pytest.raises(UnsupportedConversionError, match=said):
        convert.convert_model(src, "mlx", tmp_path / "variant", quant="4BIT")
    assert not (tmp_path / "variant").exists()


def _copied_source(builds: Builds, tmp_path: Path) -> Path:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(builds.source("llama"), src)
    return src


def _index(src: Path, shard: str) -> None:
    names = [t.name for t in read_folder_tensors(src)]
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: shard for n in names}})
    )


def _refused_at_check(src: Path, tmp_path: Path, error: type[Exception], said: str) -> None:
    """The edge's check refuses (inspection itself accepts the folder), nothing written."""
    spec = inspect_model(src)
    request = ConvertRequest(
        src=src, out=None, spec=spec, quant="4BIT", recipe=None, progress=no_progress
    )
    with pytest.raises(error, match=said) as refused:
        EDGES[0].check(request)
    assert refused.value.hint  # type: ignore[attr-defined]
    with pytest.raises(error, match=said):
        convert.convert_model(src, "mlx", tmp_path / "variant", quant="4BIT")
    assert not (tmp_path / "variant").exists()


def test_a_stray_shard_beside_the_index_is_refused(builds: Builds, tmp_path: Path) -> None:
    """mlx-lm loads every model*.safetensors, whatever the index names."""
    import shutil

    src = _copied_source(builds, tmp_path)
    _index(src, "model.safetensors")
    shutil.copyfile(src / "model.safetensors", src / "model-zzz.safetensors")
    _refused_at_check(src, tmp_path, UnsupportedConversionError, "model-zzz.safetensors")


def test_shards_mlx_lm_would_not_find_are_refused(builds: Builds, tmp_path: Path) -> None:
    src = _copied_source(builds, tmp_path)
    (src / "model.safetensors").rename(src / "weights-00001-of-00001.safetensors")
    _index(src, "weights-00001-of-00001.safetensors")
    _refused_at_check(src, tmp_path, UnsupportedConversionError, "weights-00001-of-00001")


@pytest.mark.parametrize("kind", ["fifo", "device", "oversize"])
def test_a_source_file_mlx_lm_would_hang_on_is_refused(
    builds: Builds, tmp_path: Path, kind: str
) -> None:
    import os

    from edgekit.errors import ModelFormatError

    src = _copied_source(builds, tmp_path)
    target = src / "generation_config.json"
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
        _refused_at_check(src, tmp_path, ModelFormatError, "not a regular file")
    elif kind == "device":
        target.symlink_to("/dev/zero")
        _refused_at_check(src, tmp_path, ModelFormatError, "outside the model folder")
    else:
        target.write_text(json.dumps({"pad": "x" * (2 << 20)}))
        _refused_at_check(src, tmp_path, UnsupportedConversionError, "generation_config.json")


def test_a_cache_snapshot_of_links_to_blobs_converts(builds: Builds, tmp_path: Path) -> None:
    """huggingface_hub's layout: snapshots/REV/FILE -> ../../blobs/HASH, followed."""
    import shutil

    blobs, snapshot = tmp_path / "repo" / "blobs", tmp_path / "repo" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(builds.source("llama").iterdir())):
        shutil.copyfile(f, blobs / f"blob{i}")
        (snapshot / f.name).symlink_to(Path("../../blobs") / f"blob{i}")
    convert.convert_model(snapshot, "mlx", tmp_path / "variant", quant="4BIT")
    assert (tmp_path / "variant" / "config.json").is_file()


@pytest.mark.parametrize(
    "block",
    [
        {"group_size": 64, "bits": 7},
        {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": "six"},
        {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"bits": 4.0}},
        {"group_size": 64, "bits": True},
    ],
)
def test_a_malformed_quantization_block_is_refused(builds: Builds, block: Any) -> None:
    """recorded_layout reads the block with inspection's rule (packing_from_config)."""
    from edgekit.converters.mlx.format import recorded_layout

    from edgekit.errors import ModelFormatError

    spec = inspect_model(builds.source("llama"))
    with pytest.raises(ModelFormatError):
        recorded_layout(spec, "4BIT", block)


def test_float_quants_warn_about_unused_options(builds: Builds, tmp_path: Path) -> None:
    result = convert.convert_model(
        builds.source("llama"), "mlx", tmp_path / "v", quant="F16", recipe="group_size=32"
    )
    assert any("group_size=32" in w for w in result.warnings)
    headers = _headers(tmp_path / "v")
    assert {e["dtype"] for e in headers.values()} == {"F16"}


def test_kv_cache_is_recorded(builds: Builds, tmp_path: Path) -> None:
    # mlx-lm quantizes the KV cache in groups of 64 values of a head: 64-wide heads
    wide = build_tiny_model("llama", tmp_path / "wide-hf", hidden=256)
    out = tmp_path / "wide-mlx"
    convert.convert_model(wide, "mlx", out, quant="4BIT", recipe="kv_cache=q8_0")
    settings = json.loads((out / SETTINGS_FILE).read_text())
    assert (settings["kv_cache"], settings["kv_bits"], settings["kv_group_size"]) == ("q8_0", 8, 64)


def test_a_kv_cache_the_target_cannot_quantize_is_refused(builds: Builds, tmp_path: Path) -> None:
    """The tiny Llama's heads are 16 wide: a bundle recording kv_cache=q8_0 would not
    load with its own settings, so the build refuses it before writing."""
    out = tmp_path / "v"
    with pytest.raises(UnsupportedConversionError, match="groups of 64") as info:
        convert.convert_model(
            builds.source("llama"), "mlx", out, quant="4BIT", recipe="kv_cache=q8_0"
        )
    assert "kv_cache=f16" in info.value.hint
    assert not out.exists()


# --- AWQ, GGUF sources, mlx-lm's own CLI, a quiet terminal --------------------------------------


def test_awq_on_local_text_builds_a_4bit_variant_quietly(
    builds: Builds, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    calibration = tmp_path / "calibration.txt"
    calibration.write_text(training_text())
    src = builds.source("llama")
    capfd.readouterr()
    events: list[Any] = []
    convert.convert_model(
        src,
        "mlx",
        tmp_path / "awq",
        quant="4BIT",
        recipe=f"calibration={calibration}",
        progress=events.append,
    )
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == "", printed  # mlx-lm's prints and tqdm bars
    assert events and events[-1].done == events[-1].total
    settings = json.loads((tmp_path / "awq" / SETTINGS_FILE).read_text())
    assert settings["method"] == "awq" and settings["calibration"] == "calibration.txt"
    widths = _logical_widths(src)
    assert set(_file_bits(tmp_path / "awq", widths).values()) == {4}
    ids = _hf_tokens(src, training_text())[:TEXT_TOKENS]
    kl, agree = kl_and_agreement(_hf_logits(src, ids), _mlx_logits(tmp_path / "awq", ids))
    assert kl <= BOUNDS["4BIT"][0] and agree >= BOUNDS["4BIT"][1], (kl, agree)


def test_a_gguf_source_converts_through_hf(builds: Builds, tmp_path: Path) -> None:
    require("gguf", "the GGUF writer needs it")
    src = builds.source("llama")
    gguf = tmp_path / "tiny.gguf"
    convert.convert_model(src, "gguf", gguf, quant="F32")
    out = tmp_path / "from-gguf"
    result = convert.convert_model(gguf, "mlx", out, quant="F32")
    assert result.format == "mlx"
    # the planner sizes a GGUF source by its own tensor names: the same bits per tensor
    for quant in ("4BIT", "MIXED_4_6"):
        from_gguf = FORMAT.layout(inspect_model(gguf), quant).by_storage()
        assert from_gguf == FORMAT.layout(inspect_model(src), quant).by_storage()
    ids = _hf_tokens(src, PROMPT)
    assert _mlx_greedy(out, ids, NEW_TOKENS) == _mlx_greedy(
        builds.mlx("llama", "F32"), ids, NEW_TOKENS
    )


def test_mlx_lm_generate_runs_the_variant(builds: Builds) -> None:
    out = builds.mlx("llama", "4BIT")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_lm",
            "generate",
            "--model",
            str(out),
            "--prompt",
            "hi",
            "--max-tokens",
            "5",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Generation:" in run.stdout


def test_cli_convert_to_mlx_prints_clean_json(builds: Builds, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgekit",
            "convert",
            str(builds.source("qwen3")),
            "--to",
            "mlx",
            "--quant",
            "MIXED_4_6",
            "-o",
            str(out),
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    reported = json.loads(run.stdout)  # nothing but the JSON document on stdout
    assert reported["quant"] == "MIXED_4_6" and (out / "config.json").is_file()
    assert "[INFO]" not in run.stderr and "Quantized" not in run.stderr


def _mlx_continue(folder: Path, prompt: str, tokens: int) -> str:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model, _ = load_model(folder)
    steps = generate_step(mx.array(tokenizer.encode(prompt).ids), model, max_tokens=tokens)
    return str(tokenizer.decode([int(token) for token, _ in steps]))


def test_default_model_4bit_generates_coherent_text(
    smollm2_dequantized: Any, tmp_path: Path
) -> None:
    """The embedded default model (GGUF -> HF by edgekit, then MLX), greedy through
    mlx-lm: F32's tokens are transformers' on the same folder; 4BIT (mean KL 0.49 against
    F32: its tied embedding is 4-bit too) writes English words of its own, not byte soup
    or a loop. (The Q4_1 source does not recite the novel: F32 says " sword is a just
    king.")"""
    require("mlx_lm", "the MLX build needs it")
    from tokenizers import Tokenizer

    prompt = "It is a truth universally acknowledged, that a single man in possession of a good"
    hf = smollm2_dequantized.path
    for quant in ("F32", "4BIT"):
        convert.convert_model(hf, "mlx", tmp_path / quant, quant=quant)
    ids = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(prompt).ids
    assert _mlx_greedy(tmp_path / "F32", ids, 8) == _hf_greedy(hf, ids, 8)
    text = _mlx_continue(tmp_path / "4BIT", prompt, 12)
    words = text.replace(",", " ").replace(".", " ").split()
    assert len(set(words)) >= 6 and all(w.isalpha() and w.isascii() for w in words), text
