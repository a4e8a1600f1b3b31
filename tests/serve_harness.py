"""What the server tests share: a live uvicorn server on loopback, a fake Session, raw sockets.

The fake Session is a real ``edgekit.targets.session.Session`` (the layer below the server)
whose runtime is a few lines: token ids are the prompt's UTF-8 bytes after a BOS id, a
generation yields one word a token (optionally slowly, so a test can disconnect or queue
behind it), honours ``cancel()`` like the llama.cpp session, refuses a prompt that does not
fit its context like llama.cpp does, and renders chat templates with the same sandboxed
renderer the real targets use. It records what the server asked of it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgekit.targets.session import Session
from edgekit.targets.templates import render_chat_template
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.errors import GenerationError

KEY = "test-key"
WORDS = ["Hello", " there", ",", " friend", "."]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Run:
    """One generation the fake ran."""

    prompt: list[int]
    sampling: Sampling
    tokens: int = 0
    reason: str = "running"


@dataclass
class FakeState:
    runs: list[Run] = field(default_factory=list)
    rendered: list[str] = field(default_factory=list)
    running: int = 0  # generations in progress
    rendering: int = 0  # chat templates being rendered


class FakeSession(Session):
    def __init__(
        self,
        *,
        template: str = CHATML,
        context: int = 256,
        token_delay: float = 0.0,
        fail_after: int | None = None,
        template_seconds: float | None = None,
        template_steps: int | None = None,
        word: str | None = None,
    ) -> None:
        super().__init__()
        self.template = template
        # the renderer's own bounds unless a test stretches them
        self.template_bounds: dict[str, Any] = {}
        if template_seconds is not None:
            self.template_bounds["seconds"] = template_seconds
        if template_steps is not None:
            self.template_bounds["max_steps"] = template_steps
        self.token_delay = token_delay
        self.fail_after = fail_after
        self.word = word  # the text of every token, when set (else WORDS in turn)
        self.state = FakeState()
        self._state_lock = threading.Lock()
        self.info = SessionInfo(
            target="fake",
            model_path="fake.gguf",
            context_length=context,
            threads=1,
            kv_cache="f16",
        )

    @property
    def waiting(self) -> int:
        """Generations queued behind the running one (in the session's scheduler)."""
        return self._scheduler.waiting()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        data = list(text.encode("utf-8"))  # a lone surrogate fails here, as in llama.cpp
        return [256, *data] if add_special else data

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", "replace")

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        with self._state_lock:
            self.state.rendering += 1
        try:
            text = render_chat_template(
                self.template, messages, bos_token="<s>", eos_token="</s>", **self.template_bounds
            )
        finally:
            with self._state_lock:
                self.state.rendering -= 1
        with self._state_lock:
            self.state.rendered.append(text)
        return text

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        n_ctx = self.info.context_length
        if len(prompt_tokens) >= n_ctx:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; the context holds {n_ctx}"
            )
        run = Run(prompt=list(prompt_tokens), sampling=sampling)
        with self._state_lock:
            self.state.runs.append(run)
            self.state.running += 1
        budget = min(sampling.max_tokens, n_ctx - len(prompt_tokens))
        try:
            for i in range(budget):
                if self._cancel.is_set():
                    run.reason = "cancelled"
                    yield StreamChunk(text="", tokens=0, finish_reason="cancelled")
                    return
                if self.token_delay:
                    time.sleep(self.token_delay)
                if self.fail_after is not None and i == self.fail_after:
                    raise GenerationError("the fake runtime failed mid-way")
                run.tokens += 1
                last = i == budget - 1
                if last:
                    run.reason = "length"
                yield StreamChunk(
                    text=self.word if self.word is not None else WORDS[i % len(WORDS)],
                    tokens=1,
                    finish_reason="length" if last else None,
                )
        finally:
            if run.reason == "running":
                run.reason = "closed"
            with self._state_lock:
                self.state.running -= 1

    def logits(self, tokens: Sequence[int]) -> Any:
        raise GenerationError("the fake session keeps no logits")

    def _close(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``create_app`` served by uvicorn on 127.0.0.1 in a thread, for one ``with`` block."""

    def __init__(self, session: Any, *, model_name: str = "smollm2", **overrides: Any) -> None:
        from edgekit.serve import create_app, server_for
        from edgekit.serve_config import ServeConfig

        overrides.setdefault("api_key", KEY)
        # port 0: the system picks a free one when the socket is bound (no race with others)
        config = ServeConfig(model_name=model_name, port=0, **overrides)
        self.app = create_app(session, config)
        # the server exactly as `edgekit serve` runs it (its protocol, its socket)
        self.server, self.socket = server_for(self.app, config, log_level="warning")
        self.config = replace(config, port=int(self.socket.getsockname()[1]))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    @property
    def port(self) -> int:
        return self.config.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}/v1"

    @property
    def stats(self) -> Any:
        return self.app.state.stats

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.socket.close()


def http_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str | None] | None = None,
    *,
    port: int,
    content_length: bool = True,
) -> bytes:
    """One HTTP/1.1 request as bytes (Host, Authorization and JSON content type by default)."""
    base: dict[str, str | None] = {
        "Host": f"127.0.0.1:{port}",
        "Authorization": f"Bearer {KEY}",
        "Content-Type": "application/json",
        "Connection": "close",
    }
    merged = {**base, **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in merged.items() if v is not None]
    if content_length and method != "GET":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def raw_exchange(port: int, data: bytes, *, timeout: float = 30.0) -> bytes:
    """Send ``data`` and read until the server closes (or ``timeout`` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                part = s.recv(65536)
            except TimeoutError:
                break
            if not part:
                break
            chunks.append(part)
        return b"".join(chunks)


def send_and_close(port: int, data: bytes, *, read_first: int = 0, timeout: float = 10.0) -> bytes:
    """Send ``data``, optionally read ``read_first`` bytes of the answer, then close at once
    (RST-free: a plain close, as a browser tab or a killed client does)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while len(got) < read_first:
            part = s.recv(read_first - len(got))
            if not part:
                break
            got += part
        return got


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP response (0 when there is none)."""
    head = response.split(b"\r\n", 1)[0].split()
    return int(head[1]) if len(head) >= 2 and head[1].isdigit() else 0


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
