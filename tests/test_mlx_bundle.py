"""MLX variants in bundles: ``pack --device`` on a Mac profile picks MLX where it is the
best candidate, a packed (group-wise quantized) variant inspects as the model it is, and
``edgekit.load`` holds an MLX variant to the target's own memory cap on this host
(Metal's working set on a Mac, simulated here: nothing runs on Metal).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgekit.errors import InsufficientMemoryError
from tests.conftest import require


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module in ("mlx", "mlx_lm", "torch", "transformers"):
        require(module, "the MLX build needs it")
    from tests.tiny_models import build_tiny_model

    return build_tiny_model("llama", tmp_path_factory.mktemp("mlx-bundle") / "hf")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the quality table a developer's packs filled must not change the plan's pick
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def bundle_4bit(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgekit.targets.mlx import MlxTarget

    from edgekit.bundle import VariantRequest, pack

    out = tmp_path_factory.mktemp("mlx-bundle-4bit") / "b"
    request = VariantRequest(target=MlxTarget.name, quant="4BIT", recipe="embeddings=8BIT")
    pack(tiny, out, [request])
    return out


def test_pack_for_a_mac_picks_mlx_where_it_is_the_best_candidate(
    tiny: Path, tmp_path: Path
) -> None:
    """On the M3 Max with a near-lossless budget (0.003 nats/token) only MLX 8BIT (KL
    0.0018 measured on SmolLM2) and the float formats qualify; 8BIT reads the fewest bytes
    per token, so it is the pick, and the bundle holds it and loads here (CPU build)."""
    from edgekit.targets.mlx import MlxTarget

    import edgekit
    from edgekit.bundle_open import open_bundle
    from edgekit.cli import main

    out = tmp_path / "mac"
    args = ["pack", str(tiny), "--device", "macbook-pro-m3-max", "--max-quality-loss", "0.003"]
    result = CliRunner().invoke(main, [*args, "-o", str(out), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["variants"] == ["mlx-8bit"], result.stdout
    (variant,) = open_bundle(out).manifest.variants
    assert (variant.target, variant.quant) == (MlxTarget.name, "8BIT")
    with edgekit.load(out) as session:
        assert session.info.target == MlxTarget.name
        assert session.generate("hello", max_tokens=4, temperature=0).completion_tokens == 4


def test_a_packed_variant_inspects_as_the_model_it_is(tiny: Path, bundle_4bit: Path) -> None:
    """mlx stores a b-bit weight in b/32 of the columns, as uint32 words: inspection checks the
    packed embedding against the config (8-bit here: hidden x 8 / 32 columns) and counts
    the parameters from the logical shapes, so the variant has the source's count."""
    from edgekit.bundle_open import open_bundle
    from edgekit.inspection import inspect_model

    opened = open_bundle(bundle_4bit)
    (variant,) = opened.manifest.variants
    spec, source = inspect_model(opened.variant_path(variant)), inspect_model(tiny)
    assert spec.parameters == source.parameters
    embedding = next(t for t in spec.tensors if t.name == "model.embed_tokens.weight")
    assert (embedding.dtype, embedding.shape) == (
        "U32",
        (source.vocab_size, source.hidden_size // 4),
    )


def test_load_holds_a_variant_to_the_targets_cap_on_this_host(
    bundle_4bit: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap as a Mac would report it (0.9 of Metal's working set), set below what the
    tiny variant needs: load refuses with the cap's words and how to raise it (not with
    force: the target holds a load to its cap itself)."""
    from edgekit.targets.contract import MemoryCap
    from edgekit.targets.mlx import CAP_HINT, CAP_WHY, MlxTarget

    import edgekit

    cap = MemoryCap(bytes=1 << 20, why=CAP_WHY, hint=CAP_HINT)
    monkeypatch.setattr(MlxTarget, "host_memory_cap", classmethod(lambda cls, kind: cap))
    with pytest.raises(InsufficientMemoryError) as info:
        edgekit.load(bundle_4bit)
    assert CAP_WHY in info.value.message and "0.00 GB available" in info.value.message
    assert "iogpu.wired_limit_mb" in info.value.hint and "force" not in info.value.hint
    monkeypatch.setattr(MlxTarget, "host_memory_cap", classmethod(lambda cls, kind: None))
    with edgekit.load(bundle_4bit) as session:
        assert session.info.target == MlxTarget.name


def test_the_recipes_kv_cache_reaches_generation(tmp_path: Path) -> None:
    """pack records the recipe's kv_cache as the variant's runtime setting; load passes it
    to the session, which runs mlx-lm's quantized cache (8 bits, group 64)."""
    from edgekit.targets.mlx import MlxTarget

    import edgekit
    from edgekit.bundle import VariantRequest, pack
    from tests.tiny_models import build_tiny_model

    wide = build_tiny_model("llama", tmp_path / "hf", hidden=256)  # 64-wide heads
    request = VariantRequest(target=MlxTarget.name, quant="8BIT", recipe="kv_cache=q8_0")
    (variant,) = pack(wide, tmp_path / "b", [request]).manifest.variants
    assert variant.runtime.kv_cache == "q8_0"
    with edgekit.load(tmp_path / "b") as session:
        assert (session.info.kv_cache, session.info.settings["kv_bits"]) == ("q8_0", 8)
        assert session.generate("hello", max_tokens=3, temperature=0).completion_tokens == 3


@pytest.mark.parametrize("where", ["itself", "above", "inside"])
def test_an_output_that_would_destroy_its_source_is_refused(
    tiny: Path, tmp_path: Path, where: str
) -> None:
    """--force replaces the output: pointed at the source, or a folder holding it, it
    would delete the model it reads (found by the adversarial pass: convert and pack both
    did). Refused before anything is written; the source is intact."""
    import shutil

    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from edgekit.bundle import VariantRequest, pack
    from edgekit.errors import WriteError

    parent = tmp_path / "parent"
    source = Path(shutil.copytree(tiny, parent / "model"))
    (parent / "precious.txt").write_text("keep me")
    before = sorted(p.name for p in source.iterdir())
    out = {"itself": source, "above": parent, "inside": source / "sub"}[where]
    with pytest.raises(WriteError, match="would destroy the source"):
        convert_model(source, "mlx", out, quant="4BIT", force=True)
    with pytest.raises(WriteError, match="would destroy the source"):
        pack(source, out, [VariantRequest(target=MlxTarget.name, quant="4BIT")], force=True)
    assert sorted(p.name for p in source.iterdir()) == before
    assert (parent / "precious.txt").read_text() == "keep me"
    assert not (source / "sub").exists()


@pytest.mark.parametrize(
    ("entry", "value", "says"),
    [
        ("lm_head", {"bits": 8, "group_size": 64}, "lm_head has 8 bits"),
        ("model.layers.0.self_attn.q_proj", False, "q_proj is not quantized"),
        ("model.nothing", {"bits": 4, "group_size": 64}, "do not hold"),
        ("bits", 4.0, "bits must be one of"),
    ],
)
def test_a_quantization_block_that_lies_is_refused_by_inspection(
    bundle_4bit: Path, tmp_path: Path, entry: str, value: object, says: str
) -> None:
    """The block decides how every packed tensor is read: one that disagrees with the
    stored shapes would size (and count) the model wrongly, so inspection refuses it."""
    import shutil

    from edgekit.bundle_open import open_bundle
    from edgekit.errors import ModelFormatError
    from edgekit.inspection import inspect_model

    opened = open_bundle(bundle_4bit)
    folder = Path(shutil.copytree(opened.variant_path(opened.manifest.variants[0]), tmp_path / "v"))
    config = json.loads((folder / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config[key][entry] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=says) as info:
        inspect_model(folder)
    assert info.value.hint
