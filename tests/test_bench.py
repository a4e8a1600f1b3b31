"""edgekit bench on the embedded model, on every target present: every figure is there,
labelled, consistent, in the published schema; --compare; thread sweeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"prompt_lengths": (16, 64), "gen_tokens": 12, "repeats": 2, "warmup": 1}


@pytest.fixture(scope="module")
def bundle(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("llama_cpp", "the bundle has a GGUF variant")
    require("openvino_genai", "the bundle has an OpenVINO variant")
    from edgekit.bundle import VariantRequest, pack

    out = tmp_path_factory.mktemp("bench") / "b"
    pack(
        default_gguf,
        out,
        [VariantRequest(quant="Q4_K_M"), VariantRequest(target="openvino", quant="INT4")],
    )
    return out


@pytest.mark.parametrize("variant", ["gguf-q4_k_m", "openvino-int4"])
def test_bench_reports_every_figure(bundle: Path, variant: str) -> None:
    import jsonschema

    from edgekit.bench import bench

    result = bench(bundle, variant=variant, **SMALL)
    assert (
        result.variant == variant and result.meter.name == "estimated" and not result.meter.measured
    )
    assert result.meter.unavailable["rapl"]  # why no sensor was used is recorded
    (run,) = result.runs
    assert run.load_s > 0 and run.peak_rss_mb > 50
    assert [p.prompt_tokens for p in run.prefill] == [16, 64]
    for p in run.prefill:
        assert p.ttft_s.n == 2 and p.tok_s.min <= p.prompt_tokens / p.ttft_s.median <= p.tok_s.max
        assert p.power.avg_w and p.power.peak_w >= p.power.avg_w * 0.99
        assert p.joules_per_token == pytest.approx(p.power.joules / p.prompt_tokens, rel=0.5)
    assert run.decode.tokens > 0 and run.decode.tok_s.median > 0
    assert run.decode.joules_per_token and run.decode.power.complete
    assert set(result.includes) >= {"ttft_s", "prefill_tok_s", "decode_tok_s"}
    schema = json.loads((ROOT / "docs" / "bench.schema.json").read_text())
    jsonschema.validate(result.to_dict(), schema)


def test_published_schema_is_current() -> None:
    from edgekit.bench import json_schema

    assert json.loads((ROOT / "docs" / "bench.schema.json").read_text()) == json_schema()


def test_thread_sweep(bundle: Path) -> None:
    from edgekit.bench import bench

    result = bench(
        bundle,
        variant="gguf-q4_k_m",
        threads=(1, 2),
        prompt_lengths=(16,),
        gen_tokens=8,
        repeats=1,
        warmup=0,
    )
    assert [r.threads for r in result.runs] == [1, 2]


def test_cli_bench_save_and_compare(bundle: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=600
        )

    common = ["--prompt-lengths", "16", "--gen-tokens", "8", "--repeats", "1"]
    a = run(
        "bench", str(bundle), "--variant", "gguf-q4_k_m", *common, "-o", str(tmp_path / "a.json")
    )
    assert a.returncode == 0, a.stderr
    assert "estimated" in a.stdout and "decode" in a.stdout
    b = run(
        "bench",
        str(bundle),
        "--variant",
        "openvino-int4",
        *common,
        "-o",
        str(tmp_path / "b.json"),
        "--json",
    )
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["variant"] == "openvino-int4"
    cmp = run("bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert cmp.returncode == 0, cmp.stderr
    figures = json.loads(cmp.stdout)
    assert figures["decode_tok_s"]["a"] > 0 and figures["decode_tok_s"]["change_pct"] is not None
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 9}')
    refused = run("bench", "--compare", str(bad), str(tmp_path / "a.json"))
    assert refused.returncode == 1 and "schema version" in refused.stderr
