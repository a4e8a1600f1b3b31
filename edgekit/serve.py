"""``edgekit serve``: an OpenAI-compatible HTTP server for one loaded Session.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(each streaming as server-sent events when ``stream`` is true) and ``GET /health``.

Every request is hostile until checked. In this order, each refusal an OpenAI-style JSON
error (``{"error": {"message", "type", "param", "code"}}``):

1. ``Host`` (403): an IP address, ``localhost``, the bound name or an ``allow_hosts`` name.
   A web page that rebinds its own DNS name to 127.0.0.1 sends its name here.
2. ``Origin`` (403): a browser page of another origin, unless in ``allow_origins`` (which
   alone get CORS headers, and an answer to their preflight).
3. The API key (401), compared in constant time.
4. ``Content-Type: application/json`` (415): a form or ``text/plain`` POST is what any page
   can send without asking first.
5. The body: 413 over ``max_request_bytes``, 408 when slower than ``body_timeout``, then
   ``edgekit.serve_requests.read_request`` (400 naming the field: the OpenAI schema).
6. Admission (503): at most ``queue_size`` requests running or waiting.
7. The prompt: chat template (bounded by the target) and tokenizer run on a worker thread,
   so a slow template never stalls the event loop; 400 when it does not fit the context.
8. Its turn (one generation at a time, first come first served), then the generation on a
   worker thread, its chunks handed to the event loop.

One coroutine owns a request from admission to its end and gives the slot back in a
``finally``, whatever happens. Each generation is the Session's own handle
(``Session.start``), which waits its turn in the session's scheduler: when the client goes
away, its handle is closed, so a queued request leaves the queue and never starts, and a
running one stops at its next token; no other client's generation is touched. A stream
that fails ends with an error event, not ``[DONE]``; a plain request that fails is a 500
JSON error with the message.

Modules: ``serve_config`` (ServeConfig, the names the server answers to), ``serve_http``
(headers, the responder, JSON errors), ``serve_app`` (routing, checks, admission),
``serve_generation`` (the generation's thread and its answer).
"""

from __future__ import annotations

import logging
from typing import Any

from edgekit.serve_app import App
from edgekit.serve_config import ServeConfig, is_loopback
from edgekit.targets.session import Session
from edgekit.untrusted import clean_text

log = logging.getLogger(__name__)


def create_app(session: Session, config: ServeConfig) -> App:
    """The ASGI application serving ``session`` (run it with uvicorn, or ``serve``)."""
    return App(session, config)


def serve(session: Session, config: ServeConfig) -> None:
    """Run the server until interrupted (blocking)."""
    import uvicorn

    if config.api_key is None and not is_loopback(config.host):
        log.warning(
            "serving on %s:%d without an API key: anyone who can reach it can use the model",
            clean_text(config.host),
            config.port,
        )
    uvicorn.run(
        create_app(session, config),
        host=config.host,
        port=config.port,
        log_config=_uvicorn_log_config(),
        log_level="info",
        lifespan="on",
        proxy_headers=False,  # no X-Forwarded-* from whoever connects
        server_header=False,
    )


def _uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging config with edgekit's cleaning filter on every handler: its
    loggers have handlers of their own, and their records carry client-controlled text
    (paths, header values) that must not reach a terminal raw."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["clean"] = {"()": "edgekit.terminal_text.CleanLogRecords"}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("clean")
    return config
