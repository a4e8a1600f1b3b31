"""edgekit bench: its figures against known numbers (a meter of constant watts and a
session of known speeds, on one fake clock); on the embedded model, on every target
present, every figure is there, labelled, consistent, in the published schema;
--compare; thread sweeps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from edgekit.targets.session import Session
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.power.base import PowerMeter, Reading
from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"prompt_lengths": (16, 64), "gen_tokens": 12, "repeats": 2, "warmup": 1}
WATTS = 12.5


class ConstantMeter(PowerMeter):
    """Always ``watts``, read on ``clock``."""

    name = "constant"

    def __init__(self, watts: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.watts, self.clock = watts, clock

    def read(self) -> Reading:
        return Reading(t=self.clock(), watts=self.watts)


class Clock:
    """A clock that moves only when the fake session says so."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TimedSession(Session):
    """Prefills at ``prefill`` tokens/s and decodes at ``decode`` tokens/s on ``clock``;
    records whether each generation held the session (went through its scheduler)."""

    def __init__(self, clock: Clock, *, prefill: float, decode: float) -> None:
        super().__init__()
        self.clock, self.prefill, self.decode = clock, prefill, decode
        self.held: list[bool] = []
        self.info = SessionInfo(
            target="fake", model_path="fake", context_length=4096, threads=1, kv_cache="f16"
        )

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(tokens).decode("utf-8", "replace")

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self.held.append(self._scheduler.holder() is not None)
        self.clock.t += len(prompt_tokens) / self.prefill
        for i in range(sampling.max_tokens):
            if i:
                self.clock.t += 1 / self.decode
            last = i == sampling.max_tokens - 1
            yield StreamChunk(text="x", tokens=1, finish_reason="length" if last else None)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        raise NotImplementedError

    def logits(self, tokens: Sequence[int]) -> Any:
        raise NotImplementedError

    def _close(self) -> None:
        pass


def test_figures_match_known_power_and_speeds() -> None:
    """12.5 W throughout; prefill at 2,000 tokens/s, decode at 40 tokens/s: J/token is
    12.5 / 2000 for prefill and 12.5 / 40 for decode, whatever the prompt lengths."""
    from edgekit.bench import Measurement, Workload
    from edgekit.power.sampler import PowerSampler

    clock = Clock()
    session = TimedSession(clock, prefill=2000.0, decode=40.0)
    workload = Workload(prompt_lengths=(16, 64), gen_tokens=9, repeats=3, warmup=1)
    with PowerSampler(ConstantMeter(WATTS, clock), interval_s=0.01) as sampler:
        run = Measurement(sampler, workload, clock=clock).run(session, load_s=0.5, rss_before=0)
    assert [p.prompt_tokens for p in run.prefill] == [16, 64]
    for p in run.prefill:
        assert p.ttft_s.median == pytest.approx(p.prompt_tokens / 2000.0)
        assert p.tok_s.median == pytest.approx(2000.0)
        assert p.power.avg_w == pytest.approx(WATTS) and p.power.peak_w == WATTS
        assert p.joules_per_token == pytest.approx(WATTS / 2000.0)
    assert run.decode.tokens == 8  # the tokens after the first
    assert run.decode.tok_s.median == pytest.approx(40.0)
    assert run.decode.joules_per_token == pytest.approx(WATTS / 40.0)
    assert run.decode.power.joules == pytest.approx(WATTS * 8 / 40.0)
    # every generation went through the session's scheduler: (warmup + repeats) x
    # (two prompt lengths + decode)
    assert session.held == [True] * 12


def test_a_run_is_filed_under_the_unit_the_session_ran_on() -> None:
    """The session says which compute unit it runs on (llama.cpp offloading to a GPU
    names no "device" setting); the run, and so its calibration sample, carries it."""
    from dataclasses import replace

    from edgekit.bench import Measurement, Workload
    from edgekit.power.sampler import PowerSampler

    clock = Clock()
    session = TimedSession(clock, prefill=2000.0, decode=40.0)
    session.info = replace(session.info, unit="gpu", settings={"gpu_layers": -1})
    workload = Workload(prompt_lengths=(16,), gen_tokens=3, repeats=1, warmup=0)
    with PowerSampler(ConstantMeter(WATTS, clock), interval_s=0.01) as sampler:
        run = Measurement(sampler, workload, clock=clock).run(session, load_s=0.5, rss_before=0)
    assert run.device == "gpu"


@pytest.fixture(scope="module")
def bundle(smollm2_bundle: Path) -> Path:
    require("openvino_genai", "the bundle has an OpenVINO variant")
    return smollm2_bundle


@pytest.mark.parametrize("variant", ["gguf-q4_k_m", "openvino-int4"])
def test_bench_reports_every_figure(bundle: Path, variant: str) -> None:
    """With a meter of known constant watts (whatever sensors this host has), J/token is
    those watts over the measured tokens/s."""
    import jsonschema

    from edgekit.bench import bench

    result = bench(bundle, variant=variant, meter=ConstantMeter(WATTS), **SMALL)
    assert result.variant == variant and result.meter.name == "constant"
    assert result.meter.measured and result.meter.unavailable == {}
    (run,) = result.runs
    assert run.load_s > 0 and run.peak_rss_mb > 50
    assert [p.prompt_tokens for p in run.prefill] == [16, 64]
    for p in run.prefill:
        assert p.ttft_s.n == 2 and p.tok_s.min <= p.prompt_tokens / p.ttft_s.median <= p.tok_s.max
        assert p.power.avg_w == pytest.approx(WATTS) and p.power.peak_w == pytest.approx(WATTS)
        assert p.joules_per_token == pytest.approx(WATTS * p.ttft_s.median / p.prompt_tokens)
    decode = run.decode
    assert decode.tokens > 0 and decode.tok_s.median > 0 and decode.power.complete
    assert decode.joules_per_token is not None
    # each repeat's J/token is the watts over its rate: the median lies between the extremes
    assert WATTS / decode.tok_s.max * 0.999 <= decode.joules_per_token
    assert decode.joules_per_token <= WATTS / decode.tok_s.min * 1.001
    assert set(result.includes) >= {"ttft_s", "prefill_tok_s", "decode_tok_s"}
    schema = json.loads((ROOT / "docs" / "bench.schema.json").read_text())
    jsonschema.validate(result.to_dict(), schema)


def test_published_schema_is_current() -> None:
    from edgekit.bench_results import json_schema

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
