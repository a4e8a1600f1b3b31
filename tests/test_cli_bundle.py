"""The bundle verbs end to end through the real command: pack, verify, run, chat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require


def edgekit(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgekit", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=300,
    )


@pytest.fixture(scope="module")
def bundle(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("llama_cpp", "packing uses llama.cpp's quantizer")
    out = tmp_path_factory.mktemp("cli") / "b"
    done = edgekit("pack", str(default_gguf), "--quant", "Q4_K_M", "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["variants"] == ["gguf-q4_k_m"]
    return out


def test_pack_defaults_to_the_embedded_model(tmp_path: Path) -> None:
    done = edgekit("pack", "--quant", "Q4_0", "-o", str(tmp_path / "d"), "--archive")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "d").is_file() and "packed" in done.stdout
    assert "requantizing" in done.stderr  # the Q4_1 source is said to stack errors


def test_verify(bundle: Path, tmp_path: Path) -> None:
    ok = edgekit("verify", str(bundle), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    model = bad / "gguf-q4_k_m" / "model.gguf"
    data = bytearray(model.read_bytes())
    data[1000] ^= 1
    model.write_bytes(bytes(data))
    failed = edgekit("verify", str(bad))
    assert failed.returncode == 1 and "sha256" in failed.stderr and "Traceback" not in failed.stderr


def test_run(bundle: Path) -> None:
    done = edgekit(
        "run",
        str(bundle),
        "-p",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "Paris" in result["text"] and result["completion_tokens"] == 8
    streamed = edgekit(
        "run",
        str(bundle),
        "-p",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    )
    assert streamed.stdout.strip() == result["text"].strip()
    assert "tok/s" in streamed.stderr


def test_chat_keeps_history_and_resets(bundle: Path) -> None:
    done = edgekit(
        "chat",
        str(bundle),
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        stdin="Hello!\n/reset\nWhat is the capital of France?\n/exit\n",
    )
    assert done.returncode == 0, done.stderr
    assert "history cleared" in done.stdout
    assert done.stdout.count("you> ") >= 3
