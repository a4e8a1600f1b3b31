"""A streaming OpenAI-compatible server on 127.0.0.1 for the load test's tests (the
library's, the command's and the TUI's Load tab's): it records, on its own clock, when it
received each request and sent each token, and can misbehave as told (``Behaviour``)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TTFT = (0.03, 0.05, 0.07, 0.09, 0.11)  # the fake's delay before the first token, by index
GAP = 0.02  # between two tokens


@dataclass
class Sent:
    """What the fake did for one request, on its own clock (time.perf_counter)."""

    index: int
    received: float
    token_times: list[float] = field(default_factory=list)


@dataclass
class Behaviour:
    busy_every: int = 0  # answer every n-th request with 503 (0: never)
    fail_at_token: int | None = None  # send an error event instead of this token
    huge_line: bool = False
    not_json: bool = False
    models_status: int = 200
    model: str = "fake-model"  # the one model GET /v1/models lists


class FakeOpenAI:
    """A streaming OpenAI-compatible server on 127.0.0.1 (HTTP/1.0: the stream ends when
    the connection closes, as a small server's does)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.sent: dict[int, Sent] = {}
        self.lock = threading.Lock()
        self.count = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.get(self)

            def do_POST(self) -> None:
                fake.post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def get(self, h: BaseHTTPRequestHandler) -> None:
        body = json.dumps({"object": "list", "data": [{"id": self.behaviour.model}]}).encode()
        h.send_response(self.behaviour.models_status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def post(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers["Content-Length"]))
        received = time.perf_counter()
        body = json.loads(raw)
        chat = h.path.endswith("/chat/completions")
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        index = int(prompt.split(".", 1)[0])
        with self.lock:
            self.count += 1
            n = self.count
        b = self.behaviour
        if b.busy_every and n % b.busy_every == 0:
            data = json.dumps({"error": {"message": "busy", "code": 503}}).encode()
            h.send_response(503)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        sent = Sent(index=index, received=received)
        if index >= 0:
            with self.lock:
                self.sent[index] = sent
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        tokens = body["max_tokens"]
        time.sleep(TTFT[index % len(TTFT)] if index >= 0 else 0.0)
        for i in range(tokens):
            if i:
                time.sleep(GAP)
            if b.fail_at_token == i:
                self._event(h, {"error": {"message": "the runtime failed", "code": 500}})
                return
            if b.huge_line:
                h.wfile.write(b"data: " + b"x" * (2 << 20) + b"\n\n")
                return
            if b.not_json:
                h.wfile.write(b"data: {not json\n\n")
                return
            delta = {"delta": {"content": "w"}} if chat else {"text": "w"}
            sent.token_times.append(time.perf_counter())  # as its first byte leaves
            self._event(h, {"choices": [{"index": 0, **delta, "finish_reason": None}]})
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
        self._event(h, {"choices": [], "usage": usage})
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()

    @staticmethod
    def _event(h: BaseHTTPRequestHandler, payload: dict[str, Any]) -> None:
        h.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        h.wfile.flush()
