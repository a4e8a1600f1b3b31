"""Keeping conversion tools quiet: the onnxruntime-genai builder and ONNX Runtime's
quantizer (and mlx-lm, for the MLX package) print, draw progress bars, warn and log on the
root logger; edgekit's CLI output (and ``--json``) must stay clean, so all of it goes to
edgekit's debug log. ``quiet_tools`` is the general form; ``quiet_builder`` the ONNX one."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import deque
from collections.abc import Iterator

log = logging.getLogger("edgekit.converters.onnx.export")


def quiet_builder() -> contextlib.AbstractContextManager[LogWriter]:
    """The ONNX tools, quiet (``quiet_tools`` for onnxruntime's, onnx-ir's and
    transformers' loggers, into this package's debug log)."""
    return quiet_tools(("onnxruntime", "onnxruntime_genai", "onnx_ir", "transformers"), log)


@contextlib.contextmanager
def quiet_tools(names: tuple[str, ...], debug_log: logging.Logger) -> Iterator[LogWriter]:
    """Keep the builder's prints, tqdm bars, warnings and INFO logs out of the terminal
    (they go to the ``edgekit`` debug log; ``--json`` output must stay clean). Importing
    onnxruntime's MatMulNBits quantizer runs ``logging.basicConfig``: the root handler it
    adds is removed on the way out. ONNX Runtime's QDQ quantizer warns on the root logger
    itself (``logging.warning``): a filter on the root logger sends those records to the
    debug log instead of the CLI's handlers."""
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    root_filter = _RootToDebug(debug_log)
    root.addFilter(root_filter)
    noisy = [logging.getLogger(n) for n in names]
    levels = [n.level for n in noisy]
    writer = LogWriter(debug_log)
    try:
        for logger in noisy:
            logger.setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(writer), contextlib.redirect_stderr(writer):
                yield writer
    finally:
        root.removeFilter(root_filter)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(root_level)
        for logger, level in zip(noisy, levels, strict=True):
            logger.setLevel(level)


class _RootToDebug(logging.Filter):
    """Records logged on the root logger itself go to edgekit's debug log, not out."""

    def __init__(self, debug_log: logging.Logger) -> None:
        super().__init__()
        self.debug_log = debug_log

    def filter(self, record: logging.LogRecord) -> bool:
        self.debug_log.debug("%s: %s", record.levelname, record.getMessage())
        return False


class LogWriter(io.StringIO):
    """Lines to the debug log, the last few kept for an error's hint."""

    def __init__(self, debug_log: logging.Logger = log) -> None:
        super().__init__()
        self.debug_log = debug_log
        self.tail: deque[str] = deque(maxlen=3)

    def write(self, text: str) -> int:
        for line in text.replace("\r", "\n").splitlines():
            if line.strip():
                self.debug_log.debug("%s", line.rstrip())
                self.tail.append(line.strip()[:200])
        return len(text)
