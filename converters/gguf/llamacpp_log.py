"""Route llama.cpp's own log lines into Python logging (logger ``edgekit.llamacpp``).

llama.cpp writes to stderr by default, which would break the CLI's one-screen errors and
the TUI. Once routed, its lines appear with ``-vv`` (DEBUG) and errors with ``-v``.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("edgekit.llamacpp")
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 cont
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.WARNING}
_callback: Any = None  # kept referenced: ctypes frees a callback that Python forgets


def route_llamacpp_logs() -> None:
    """Install the log callback once per process."""
    global _callback
    if _callback is not None:
        return
    import llama_cpp

    def on_log(level: int, text: bytes, _user: Any) -> None:
        message = text.decode("utf-8", errors="replace").rstrip("\n")
        if message:
            log.log(_LEVELS.get(level, logging.DEBUG), "%s", message)

    _callback = llama_cpp.llama_log_callback(on_log)
    llama_cpp.llama_log_set(_callback, None)
