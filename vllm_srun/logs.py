"""structlog set-up: JSON lines when stderr is not a terminal, readable lines when it is.

Lines of the standard library's loggers (uvicorn's, arq's, any library's) go through the same
renderer, with their logger's name: one format for every line.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

_OUR_ERROR = re.compile(r"vllm_srun\.errors\.\w+: (.*)")


def configure(level: str = "info") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    _route_stdlib(numeric, renderer, stamp)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=True,
    )
    # arq logs every job at INFO; that is per-request noise for a server.
    logging.getLogger("arq").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("uvicorn.error").addFilter(_RuntimeErrorsWithoutTraceback())


def _route_stdlib(numeric: int, renderer: Any, stamp: Any) -> None:
    """The root logger's handler renders as structlog does, as logging.basicConfig would add it:
    only where the root logger has no handler yet (a test's capture keeps its own)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(_CurrentStderr())  # type: ignore[arg-type]
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root.addHandler(handler)
    root.setLevel(numeric)


class _CurrentStderr:
    """sys.stderr as it is when a line is written, not as it was when logging was configured:
    a stream replaced since (a test's capture, then closed) must not fail whoever logs next,
    such as a coalescer reporting a failed forward."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _RuntimeErrorsWithoutTraceback(logging.Filter):
    """A start-up failure of our own (bad device, bad package) is a message, not a traceback.

    uvicorn logs the app's failed start-up as the formatted traceback Litestar hands it; when
    its last line is one of the runtime's own errors, only that line is worth showing.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        ours = _OUR_ERROR.findall(text) if "Traceback" in text else []
        if ours:
            record.msg = "error: " + ours[-1]
            record.args = ()
        return True
