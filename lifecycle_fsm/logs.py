"""Logging setup for the command line: the only place `structlog.configure` is called.

Library modules use `get_logger(__name__)` (below) and emit stable snake_case events
(`event_appended`, `decision_recorded`, `checkpoint_skipped`, `command_retried`);
embedders configure structlog (or stdlib logging) as they like. The CLI logs to stderr: JSON lines when stderr is
not a terminal (for collectors), a readable console format when it is.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

__all__ = ["Logger", "configure_logging", "get_logger"]

# logging's own numbers (DEBUG, INFO, WARNING, ERROR): `logging` itself is imported only when
# an event is wanted, so a CLI command that logs nothing at its level never pays for it.
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def configure_logging(level: str = "warning", *, json_lines: bool | None = None) -> None:
    """Send structured logs at `level` and above to stderr.

    structlog itself is configured when the first event at `level` or above is logged
    (or now, if something already imported it): `import structlog` pulls its dev console
    (rich, pygments, asyncio; ~85 ms), which a CLI command that logs nothing never pays.
    """
    global _PENDING  # noqa: PLW0603 - the one process-wide logging setting, as structlog's own
    numeric = _LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, not {level!r}")
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    _PENDING = (numeric, json_lines)
    if "structlog" in sys.modules:
        _apply_pending()


_PENDING: tuple[int, bool] | None = None


def _apply_pending() -> None:
    """Configure structlog as `configure_logging` asked (imports it)."""
    global _PENDING  # noqa: PLW0603 - see configure_logging
    if _PENDING is None:
        return
    numeric, json_lines = _PENDING
    _PENDING = None
    import orjson
    import structlog

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


class Logger:
    """A library logger that is polite when nobody configured structlog.

    If the application configured structlog (or a test captures logs), events go
    through structlog with their key-value context. Otherwise they go to the stdlib
    `logging` logger of the same name, which prints nothing below WARNING unless the
    application asks for it, so embedding the library never writes to stdout.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    @property
    def _stdlib(self) -> logging.Logger:
        """The stdlib logger of the same name (imports `logging` on first use)."""
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self.name)
        return self._logger

    def _log(self, level: int, event: str, fields: dict[str, object]) -> None:
        if _PENDING is not None:  # the CLI asked for logs at a level: below it, nothing; else set structlog up now
            if level < _PENDING[0]:
                return
            _apply_pending()
        # structlog is only configured if someone imported it: never import it here.
        structlog = sys.modules.get("structlog")
        if structlog is not None and structlog.is_configured():
            import logging  # structlog imported it already

            getattr(structlog.get_logger(self.name), logging.getLevelName(level).lower())(event, **fields)
        elif self._stdlib.isEnabledFor(level):
            self._stdlib.log(level, "%s %s", event, " ".join(f"{k}={v!r}" for k, v in fields.items()))

    def enabled(self, level: int = _LEVELS["info"]) -> bool:
        """Whether an event at `level` would go anywhere: a hot path skips building one that would not.

        The same tests as `_log`, without its side effect (setting structlog up).
        """
        if _PENDING is not None:
            return level >= _PENDING[0]
        structlog = sys.modules.get("structlog")
        if structlog is not None and structlog.is_configured():
            return True  # structlog filters by level itself, after the call
        return self._stdlib.isEnabledFor(level)

    def debug(self, event: str, **fields: object) -> None:
        self._log(_LEVELS["debug"], event, fields)

    def info(self, event: str, **fields: object) -> None:
        self._log(_LEVELS["info"], event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._log(_LEVELS["warning"], event, fields)


def get_logger(name: str) -> Logger:
    """The logger library modules use (see `Logger`)."""
    return Logger(name)
