"""``edgekit serve``: an OpenAI-compatible HTTP server for one loaded Session.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(each streaming as server-sent events when ``stream`` is true), ``GET /health`` (no key:
for load balancers; the status and the slots idle and processing) and ``GET /metrics``
(Prometheus text; the API key when one is set, as ``/v1/models``). docs/serving.md lists
the metrics.

Every request is hostile until checked. In this order, each refusal an OpenAI-style JSON
error (``{"error": {"message", "type", "param", "code"}}``):

0. The connection: closed unanswered when its request's headers take longer than
   ``header_timeout`` (uvicorn itself would wait forever: slowloris).
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
``serve_generation`` (the generation's thread and its answer), ``serve_metrics`` (the
registry and the Prometheus text), ``serve_telemetry`` (what a request's events count),
``serve_power`` (the power meter's thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from typing import TYPE_CHECKING, Any

from edgekit.errors import EdgekitError, ServeError
from edgekit.power.base import PowerMeter
from edgekit.serve_app import App
from edgekit.serve_config import ServeConfig, is_loopback
from edgekit.serve_power import PowerWatch
from edgekit.targets.session import Session
from edgekit.untrusted import clean_text

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)


def create_app(session: Session, config: ServeConfig) -> App:
    """The ASGI application serving ``session`` (run it with uvicorn, or ``serve``)."""
    return App(session, config)


def serve(
    session: Session, config: ServeConfig, *, meter: str | PowerMeter | None = "auto"
) -> None:
    """Run the server until interrupted (blocking).

    ``meter`` is the power meter ``/metrics`` reports from: ``"auto"`` the best one
    readable here (the estimate where no sensor is), one by name (``rapl``, ``nvml``,
    ``estimated``, ...), a ``PowerMeter`` (the caller's to close), or None for no power
    figures.

    Raises:
        ServeError: the address cannot be listened on (the port is taken, say).
    """
    if config.api_key is None and not is_loopback(config.host):
        log.warning(
            "serving on %s:%d without an API key: anyone who can reach it can use the model",
            clean_text(config.host),
            config.port,
        )
    app = create_app(session, config)
    server, listening = server_for(app, config)
    power = _power_meter(meter)
    watch = PowerWatch(power, app.metrics) if power is not None else contextlib.nullcontext()
    # uvicorn re-raises the Ctrl-C it handled, once it has shut down: that is the end
    try:
        with listening, watch, contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[listening])
    finally:
        if power is not None and power is not meter:  # one chosen here: closed here
            power.close()


def _power_meter(meter: str | PowerMeter | None) -> PowerMeter | None:
    """The meter ``serve`` reads (see there); None when there is none to read."""
    if meter is None or isinstance(meter, PowerMeter):
        return meter
    from edgekit.power.select import use_meter
    from edgekit.probe import probe_host

    try:
        envelope = probe_host().profile.power  # the estimate's idle and full-load watts
        chosen, _ = use_meter(
            None if meter == "auto" else meter, idle_w=envelope.idle_w, max_w=envelope.max_w
        )
    except EdgekitError as exc:
        log.warning("no power figures in /metrics: %s", clean_text(exc, max_len=300))
        return None
    return chosen


def server_for(
    app: App, config: ServeConfig, *, log_level: str = "info"
) -> tuple[uvicorn.Server, socket.socket]:
    """The uvicorn server of ``app`` and the socket it serves, bound here: uvicorn binds by
    itself with ``sys.exit`` on failure, which no library call may do, so a taken port is
    a ServeError instead. Run it with ``server.run(sockets=[sock])``."""
    import uvicorn

    listening = listen(config.host, config.port)
    settings = uvicorn.Config(
        app,
        http=_header_deadline_protocol(config.header_timeout),
        log_config=_uvicorn_log_config(),
        log_level=log_level,
        lifespan="on",
        proxy_headers=False,  # no X-Forwarded-* from whoever connects
        server_header=False,
    )
    return uvicorn.Server(settings), listening


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (not listening yet: uvicorn starts that)."""
    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((name, port))
    except OSError as exc:
        sock.close()
        hint = {
            errno.EADDRINUSE: "another program uses this port: pass a free one with --port",
            errno.EACCES: "ports below 1024 need privileges: pass --port 8000 or above",
        }.get(exc.errno or 0, "pass an address this machine has with --host")
        raise ServeError(
            f"cannot listen on {clean_text(host)}:{port}: {exc.strerror or exc}", hint=hint
        ) from exc
    return sock


def _header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, with a deadline for each request's headers.

    uvicorn times a connection out only between requests, and resets even that timer on
    every byte: a client that connects and sends nothing, or trickles its headers a byte
    at a time, holds its connection (a file descriptor) forever, and enough of them stop
    the server from accepting anyone (slowloris). The app cannot help: it is called only
    once the headers are complete. So a connection must complete a request's headers
    within ``seconds`` of connecting, or of its previous response, or it is closed; the
    body has its own deadline in the app (``body_timeout``). Defined here because uvicorn
    is an optional dependency."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers arrived: the app takes over
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():  # armed first: a pipelined request disarms
                self._arm()
            super().on_response_complete()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self.timeout_keep_alive_handler)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

    return HeaderDeadline


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
