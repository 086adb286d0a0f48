"""The small rules a Ledger command applies to its arguments before any work.

Kept apart from `ledger.py` so the facade reads as the list of commands: the clock
and the actor events are stamped with, a candidate's default id, and the argument
checks that make bad input an `InputError` (or a missing baseline a `ConflictError`)
before anything is hashed or appended.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
from pathlib import Path
from typing import Any

from lifecycle_fsm.errors import ConflictError, InputError
from lifecycle_fsm.limits import MAX_INT64, check_int
from lifecycle_fsm.rules import TRUSTED_STATE_KINDS
from lifecycle_fsm.state import LedgerSettings

__all__ = [
    "default_actor",
    "default_id",
    "non_negative",
    "path_argument",
    "require_baseline",
    "require_kind",
    "utc_now",
]

JSON = dict[str, Any]


def utc_now() -> str:
    """The clock events are stamped with (UTC, microseconds); never read on replay."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def path_argument(name: str, value: object) -> str:
    """A path the caller passed, as a `str`: a `str` or an `os.PathLike` of one; anything else
    (None, a number, bytes) is an InputError naming the argument, not `os.fspath`'s TypeError,
    and so is one holding a NUL (no file system path does: `os.stat`'s bare ValueError)."""
    if type(value) is not str:  # the common case skips this: no ABC check (issue #13)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise InputError(f"{name} must be a path (a str or os.PathLike), not {type(value).__name__} ({value!r})")
    if "\x00" in value:
        raise InputError(f"{name} {value!r} holds a NUL character, which no file system path can")
    return value


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def default_id(fields: JSON, manifest_path: str | os.PathLike[str]) -> str:
    """The manifest's policy_version; without a usable one, the manifest's path as given.

    An empty version is a semantic problem, not an input error: the candidate is
    received under its path and its check rejects it (`candidate_identity`).
    """
    version = fields.get("policy_version")
    if isinstance(version, str) and version.strip() and not any(ch in version for ch in "\n\r\t\0"):
        return version
    return Path(os.path.normpath(manifest_path)).as_posix()


def non_negative(name: str, value: object) -> int:
    """An int (not a bool) in 0..2^63-1: a larger window would be stored and could never go lower."""
    return check_int(name, value, minimum=0, maximum=MAX_INT64)


def require_kind(kind: str) -> None:
    if kind not in TRUSTED_STATE_KINDS:
        raise InputError(f"unknown trusted-state kind {kind!r} (expected one of {', '.join(TRUSTED_STATE_KINDS)})")


def require_baseline(settings: LedgerSettings) -> None:
    if settings.baseline is None:
        raise ConflictError("no active baseline: run `lifecycle baseline activate SFT_MANIFEST` first")
