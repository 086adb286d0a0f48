"""Logging setup for the command line: the only place `structlog.configure` is called.

Library modules only do `structlog.get_logger(__name__)` and emit stable snake_case
events (`event_appended`, `decision_recorded`, `checkpoint_skipped`, …); embedders
configure structlog as they like. The CLI logs to stderr: JSON lines when stderr is
not a terminal (for collectors), a readable console format when it is.
"""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

__all__ = ["configure_logging"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "warning", *, json_lines: bool | None = None) -> None:
    """Send structured logs at `level` and above to stderr."""
    numeric = _LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, not {level!r}")
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_lines:
        processors += [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer(serializer=orjson.dumps)]
        factory: structlog.typing.WrappedLogger = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
