"""Logging: library modules emit stable snake_case events (`event_appended`, `command_retried`, …)
through `get_logger(__name__)`: to structlog when the application configured it, else to the stdlib
logger of the same name (silent below WARNING). Only the CLI configures structlog (stderr: JSON lines,
or a console format on a terminal), and only once the first event at its level is written: importing
structlog costs more than the rest of a short command's start-up.
"""

from __future__ import annotations

import sys

_LEVELS = ("debug", "info", "warning", "error")  # the stdlib's level names, lowest first

# The command line's setting, (level, json_lines), until the first event at its level applies it.
_pending: dict[str, tuple[str, bool | None]] = {}


def configure_logging(level: str = "warning", *, json_lines: bool | None = None) -> None:
    """Send structured logs at `level` and above to stderr (the command line's setting); `json_lines`
    defaults to whether stderr is not a terminal when the first event is written."""
    if level.lower() not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, not {level!r}")
    _pending["cli"] = (level.lower(), json_lines)


def _configure_structlog(level: str, json_lines: bool | None) -> None:
    import orjson
    import structlog

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
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )


class Logger:
    """A library logger: structlog when the application configured it, else the stdlib's (see module)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def enabled(self, level: str) -> bool:
        """Whether an event at `level` would be written (a caller may skip building its fields)."""
        setting = _pending.get("cli")
        if setting is not None:
            return _LEVELS.index(level) >= _LEVELS.index(setting[0])
        lib = sys.modules.get("structlog")
        if lib is not None and lib.is_configured():
            return True  # its filtering logger decides
        import logging

        return logging.getLogger(self.name).isEnabledFor(getattr(logging, level.upper()))

    def _log(self, level: str, event: str, fields: dict[str, object]) -> None:
        if not self.enabled(level):
            return
        setting = _pending.get("cli")
        if setting is not None:  # configured before the setting is dropped: another thread meanwhile waits for it
            _configure_structlog(*setting)  # two threads may both get here: the same setting, twice
            _pending.pop("cli", None)
        lib = sys.modules.get("structlog")
        if lib is not None and lib.is_configured():
            getattr(lib.get_logger(self.name), level)(event, **fields)
            return
        import logging

        message = " ".join(f"{k}={v!r}" for k, v in fields.items())
        logging.getLogger(self.name).log(getattr(logging, level.upper()), "%s %s", event, message)

    def info(self, event: str, **fields: object) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._log("warning", event, fields)


def get_logger(name: str) -> Logger:
    return Logger(name)
