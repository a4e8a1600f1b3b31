"""pack --device for a Snapdragon phone: the bundle holds the plan's pick and the HTP
variant compiled for the phone's SoC (the profile's soc, through the candidate's
build_recipe); on this x86 host the pick loads and the HTP variant is refused with the
reason. Tiny Llama model; the compile step needs onnxruntime-qnn (the all extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgekit.converters.planner import plan_for

import edgekit
from edgekit.bundle import VariantRequest
from edgekit.cli import main
from edgekit.errors import TargetUnavailableError
from tests.conftest import require
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("torch", "the tiny model is built with transformers")
    require("onnxruntime_genai", "the HTP variant is built with onnxruntime-genai's builder")
    require("onnxruntime_qnn", "the context binaries are compiled with onnxruntime-qnn")
    return build_tiny_model("llama", tmp_path_factory.mktemp("pack-htp"))


@pytest.fixture(scope="module")
def packed(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("pack-htp-out") / "phone"
    result = CliRunner().invoke(
        main,
        [
            "pack",
            str(source),
            "--device",
            "galaxy-s25-ultra",
            "--context",
            "256",
            "-o",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    return {"out": out, "json": json.loads(result.stdout)}


def test_the_plan_adds_the_htp_variant_for_the_phones_soc(source: Path) -> None:
    plan = plan_for(source, "galaxy-s25-ultra")
    requests = VariantRequest.for_device(plan)
    assert (requests[0].target, requests[0].quant) == (plan.choice.target, plan.choice.format)
    htp = [r for r in requests if r.target == "qnn" and r.quant in ("W16A16", "W8A16", "FP16")]
    assert len(htp) == 1
    assert "soc=SM8750" in htp[0].recipe and "part_gib=4" in htp[0].recipe


def test_pack_device_writes_a_context_binary_variant_for_sm8750(packed: dict) -> None:
    out: Path = packed["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    names = [v["name"] for v in manifest["variants"]]
    htp = next(n for n in names if n in ("onnx-w16a16", "onnx-w8a16", "onnx-fp16"))
    folder = out / htp
    settings = json.loads((folder / "edgekit.json").read_text())
    assert settings["htp"]["stage"] == "context"
    assert (settings["htp"]["soc"], settings["htp"]["htp_arch"]) == ("SM8750", 79)
    # the static KV cache is the context the bundle records for the variant
    runtime = next(v for v in manifest["variants"] if v["name"] == htp)["runtime"]
    assert settings["htp"]["context_length"] == runtime["context"] == 256
    assert list(folder.glob("*_ctx.onnx")) and list(folder.glob("*.bin"))
    assert not list(folder.glob("part*.prompt.onnx")), "the QDQ graphs are not shipped"
    config = json.loads((folder / "genai_config.json").read_text())
    stages = config["model"]["decoder"]["pipeline"][0]
    qnn = [
        s["session_options"]["provider_options"][0]["qnn"]
        for s in stages.values()
        if "session_options" in s
    ]
    assert qnn and all(o["soc_model"] == "69" and o["htp_arch"] == "79" for o in qnn)
    assert "/" not in json.dumps(qnn), "no path of this host in the shipped options"


def test_on_this_host_the_pick_loads_and_the_htp_variant_is_refused(packed: dict) -> None:
    out: Path = packed["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    htp = next(
        v["name"]
        for v in manifest["variants"]
        if v["target"] == "qnn" and v["name"].split("-", 1)[1] in ("w16a16", "w8a16", "fp16")
    )
    with edgekit.load(out) as session:
        assert session.variant.name != htp
        assert session.generate("Hello", max_tokens=3, temperature=0)
    with pytest.raises(TargetUnavailableError, match="HTP"):
        edgekit.load(out, variant=htp)


def test_a_recipe_that_contradicts_the_device_is_refused(source: Path) -> None:
    """--recipe soc=SM8650 with --device galaxy-s25-ultra would compile for another chip
    than the phone's (the review found it silently did); smaller parts are fine."""
    from edgekit.errors import UnsupportedConversionError

    plan = plan_for(source, "galaxy-s25-ultra")
    for recipe in ("soc=SM8650", "part_gib=8"):
        with pytest.raises(UnsupportedConversionError, match="contradicts galaxy-s25-ultra"):
            VariantRequest.for_device(plan, recipe=recipe)
    htp = [r for r in VariantRequest.for_device(plan, recipe="part_gib=1") if r.target == "qnn"]
    assert htp and "part_gib=1" in htp[0].recipe and "part_gib=4" not in htp[0].recipe
    assert "soc=SM8750" in htp[0].recipe
