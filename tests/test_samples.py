"""Each sample runs as written (the Tk window's logic is driven headless)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import require

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, SAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_package_for_laptop(default_gguf: Path, tmp_path: Path) -> None:
    require("llama_cpp", "the sample packs a GGUF bundle")
    done = subprocess.run(
        [
            sys.executable,
            str(SAMPLES / "package_for_laptop.py"),
            str(default_gguf),
            str(tmp_path / "laptop.bundle"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "bundle:" in done.stdout and "Paris" in done.stdout
    assert (tmp_path / "laptop.bundle" / "manifest.json").is_file()


def test_openai_client_sample(default_gguf: Path) -> None:
    require("openai", "the sample uses the openai client")
    from edgekit.targets.llamacpp import LlamaCppTarget

    from tests.test_serve import KEY, LiveServer

    with LlamaCppTarget.load(default_gguf, context=512) as session, LiveServer(session) as live:
        env = {**os.environ, "EDGEKIT_URL": live.url, "EDGEKIT_API_KEY": KEY}
        done = subprocess.run(
            [sys.executable, str(SAMPLES / "openai_client.py")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model: smollm2") and len(done.stdout.splitlines()) >= 2


class FakeSession:
    """Streams a fixed reply slowly, honouring cancel(): a fake of the layer below."""

    def __init__(self) -> None:
        import threading

        self.cancelled = threading.Event()
        self.seen: list[list[dict[str, str]]] = []

    def cancel(self) -> None:
        self.cancelled.set()

    def chat_stream(self, history: list[dict[str, str]], **_: Any) -> Any:
        from edgekit.targets.values import StreamChunk

        self.cancelled.clear()
        self.seen.append([dict(m) for m in history])
        for word in ["Hello", " there", ",", " friend", "."] * 20:
            if self.cancelled.is_set():
                yield StreamChunk(text="", tokens=0, finish_reason="cancelled")
                return
            time.sleep(0.01)
            yield StreamChunk(text=word, tokens=1)
        yield StreamChunk(text="", tokens=0, finish_reason="stop")


def _drain(controller: Any) -> tuple[str, str]:
    text, done = [], ""
    while not controller.events.empty():
        kind, payload = controller.events.get_nowait()
        if kind == "text":
            text.append(payload)
        else:
            done = payload
    return "".join(text), done


def test_tk_chat_controller_streams_keeps_history_and_stops() -> None:
    controller = _module("desktop_chat_tk").ChatController(FakeSession())
    assert controller.send("hi")
    assert not controller.send("again")  # one reply at a time
    controller.wait(10)
    text, done = _drain(controller)
    assert text.startswith("Hello there, friend.") and done == "stop"
    assert [m["role"] for m in controller.history] == ["user", "assistant"]

    assert controller.send("tell me more")
    time.sleep(0.05)
    controller.stop()
    controller.wait(10)
    text, done = _drain(controller)
    assert done == "cancelled" and len(text) < 200
    assert controller.session.seen[1][-1] == {"role": "user", "content": "tell me more"}
    assert not controller.send("   ")


def test_tk_chat_controller_with_a_real_session(default_gguf: Path) -> None:
    require("llama_cpp", "a real session")
    from edgekit.targets.llamacpp import LlamaCppTarget

    with LlamaCppTarget.load(default_gguf, context=512) as session:
        controller = _module("desktop_chat_tk").ChatController(session, max_tokens=16)
        assert controller.send("Say hello.")
        controller.wait(60)
        text, done = _drain(controller)
    assert text and done in ("stop", "length")
