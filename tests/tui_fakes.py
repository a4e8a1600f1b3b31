"""Recorded inputs for the TUI tests: a host probe, a session, saved bench results.

These stand in for the layers below the TUI (the probe and the runtimes have their own
tests); the TUI's behaviour and look are what is under test here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgekit.targets.availability import TargetStatus
from edgekit.targets.handles import GenerationHandle, HandleState
from edgekit.targets.values import Generation, StreamChunk

from edgekit.devices import load_profile
from edgekit.host.sensors import SensorFacts
from edgekit.probe import HostReport, ProbePart

RESULTS = Path(__file__).parent / "data" / "bench-results"


def recorded_probe() -> HostReport:
    """A probe as it reads on a fanless x86 laptop without sensors (fixed values)."""
    return HostReport(
        profile=load_profile("x86-laptop-no-gpu"),
        hostname="laptop",
        os_release="Linux-6.8-x86_64",
        board=None,
        jetson=None,
        nvidia_gpus=(),
        target_devices={},
        sensors=(
            SensorFacts(name="rapl", readable=False, detail="no powercap RAPL zones"),
            SensorFacts(name="battery", readable=True, detail="/sys/class/power_supply/BAT0"),
        ),
        targets=(
            TargetStatus(
                name="llamacpp", installed=True, usable=True, version="0.3.36", detail="CPU"
            ),
            TargetStatus(
                name="openvino", installed=True, usable=True, version="2026.4.1", detail="CPU"
            ),
        ),
        parts=(ProbePart(name="cpu", ok=True, detail="recorded"),),
    )


class FakeClock:
    """Each call is 20 ms after the previous one: 50 tokens/s when one token per call."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.02
        return self.t


class FakeGeneration(GenerationHandle):
    """A fixed reply, a token per word, with its own cancel (the handle a Session gives);
    ``fail`` is raised after the first word, as a runtime bug would be (not an edgekit
    error: the Session boundary is not in this fake)."""

    def __init__(self, reply: str, fail: BaseException | None = None) -> None:
        self.words = reply.split(" ")
        self.fail = fail
        self.cancelled = False
        self.closed = False
        self.at = 0
        self.ended = False

    @property
    def state(self) -> HandleState:
        return "closed" if self.closed else "finished" if self.ended else "running"

    @property
    def started(self) -> bool:
        return True

    @property
    def prompt_tokens(self) -> int:
        return 0

    def __next__(self) -> StreamChunk:
        if self.ended or self.closed:
            raise StopIteration
        if self.cancelled:
            self.ended = True
            return StreamChunk(text="", tokens=0, finish_reason="cancelled")
        if self.fail is not None and self.at == 1:
            raise self.fail
        word, self.at = self.words[self.at], self.at + 1
        last = self.at == len(self.words)
        self.ended = last
        return StreamChunk(
            text=word + ("" if last else " "), tokens=1, finish_reason="stop" if last else None
        )

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        self.closed = True

    def result(self) -> Generation:
        text = "".join(c.text for c in self)
        return Generation(text=text, prompt_tokens=0, completion_tokens=0, finish_reason="stop")


class FakeSession:
    """A session that streams a fixed reply, a token per word; ``fail``: every reply
    raises it after the first word."""

    REPLY = "Paris is the capital of France."

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.generations: list[FakeGeneration] = []
        self.closed = False
        self.variant = None
        self.info = type("Info", (), {"target": "fake"})()

    def chat_stream(self, messages: Sequence[dict[str, str]], **_: Any) -> FakeGeneration:
        self.generations.append(FakeGeneration(self.REPLY, self.fail))
        return self.generations[-1]

    def close(self) -> None:
        self.closed = True


def write_result(folder: Path, name: str, *, variant: str, decode: float, rss: float) -> Path:
    """A saved bench result with the given headline figures (schema version 1)."""

    def spread(v: float) -> dict[str, float]:
        return {"median": v, "min": v, "max": v, "stdev": 0.0, "n": 3}

    power = {"avg_w": 12.0, "peak_w": 14.0, "joules": 1.2, "complete": True}
    data = {
        "schema_version": 1,
        "created": "2026-11-30T00:00:00+00:00",
        "edgekit_version": "0.1.0",
        "host": "recorded",
        "bundle": "/bundles/smollm2",
        "variant": variant,
        "target": "llamacpp" if variant.startswith("gguf") else "openvino",
        "quant": variant.split("-")[1].upper(),
        "meter": {"name": "estimated", "measured": False, "interval_s": 0.1, "unavailable": {}},
        "includes": {},
        "thermal": {
            "cpu_mhz_before": None,
            "cpu_mhz_after": None,
            "temp_c_before": None,
            "temp_c_after": None,
            "power_mode": None,
            "throttled": False,
        },
        "runs": [
            {
                "threads": 2,
                "context": 4096,
                "load_s": 0.25,
                "prefill": [
                    {
                        "prompt_tokens": p,
                        "ttft_s": spread(p / (4 * decode)),
                        "tok_s": spread(4 * decode),
                        "power": power,
                        "joules_per_token": 0.03,
                    }
                    for p in (128, 512)
                ],
                "decode": {
                    "tokens": 127,
                    "tok_s": spread(decode),
                    "power": power,
                    "joules_per_token": 12.0 / decode,
                },
                "peak_rss_mb": rss,
                "rss_before_load_mb": 100.0,
                "device": "cpu",
            }
        ],
    }
    path = folder / name
    path.write_text(json.dumps(data, indent=1))
    return path
