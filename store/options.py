"""The connection options every store takes (`synchronous`, `busy_timeout`), checked once.

A bad value is an `InputError` naming the option, before a connection is made and the
same on SQLite and PostgreSQL: not `int()`'s ValueError for a NaN, an OverflowError
for infinity, an AttributeError for a mode that is not a string, nor (SQLite) a
negative timeout taken silently as "never wait".
"""

from __future__ import annotations

import math
from collections.abc import Collection

from lifecycle_fsm.store.errors import InputError

__all__ = ["MAX_BUSY_TIMEOUT", "busy_timeout_seconds", "synchronous_mode"]

# Both backends keep the wait in milliseconds in a C int (SQLite's busy_timeout, PostgreSQL's lock_timeout).
MAX_BUSY_TIMEOUT = (2**31 - 1) / 1000


def busy_timeout_seconds(value: object, name: str = "busy_timeout") -> float:
    """A finite number of seconds from 0 to `MAX_BUSY_TIMEOUT` (~24.8 days); else an InputError."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InputError(f"{name} must be a number of seconds, not {value!r}")
    if not (0 <= value <= MAX_BUSY_TIMEOUT) or (isinstance(value, float) and not math.isfinite(value)):
        raise InputError(f"{name} must be a finite number of seconds from 0 to {MAX_BUSY_TIMEOUT}, not {value!r}")
    return float(value)


def synchronous_mode(value: object, modes: Collection[str]) -> str:
    """`value` upper-cased when it is one of `modes` (case-insensitive); else an InputError."""
    mode = value.upper() if isinstance(value, str) else None
    if mode is None or mode not in modes:
        raise InputError(f"synchronous must be one of {', '.join(modes)}, not {value!r}")
    return mode
