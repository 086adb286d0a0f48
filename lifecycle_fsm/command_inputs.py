"""The small rules a Ledger command applies to its arguments before any work: the clock and actor
events are stamped with, a candidate's default id, and the checks that make bad input an `InputError`
(a missing baseline a `ConflictError`) before anything is hashed or appended."""

from __future__ import annotations

import datetime as dt
import difflib
import getpass
import os
import re
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path

from lifecycle_fsm.errors import ConflictError, InputError, StoreError
from lifecycle_fsm.events import text_or_error
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import check_actor
from lifecycle_fsm.retry import RetryPolicy
from lifecycle_fsm.rules import is_identity
from lifecycle_fsm.state import LedgerSettings
from lifecycle_fsm.store.chain import STORED_TIME
from lifecycle_fsm.streams import check_cache_size

__all__ = [
    "check_key",
    "checked_options",
    "default_actor",
    "default_id",
    "path_argument",
    "read_only_folder",
    "recorded_time",
    "require_baseline",
    "require_choice",
    "utc_now",
]


def utc_now() -> str:
    """The clock events are stamped with (UTC, microseconds); never read on replay."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def path_argument(name: str, value: object) -> str:
    """A path the caller passed (a `str` or an `os.PathLike` of one) as a `str`; anything else, or a NUL in
    it, is an InputError naming the argument (not `os.fspath`'s TypeError or `os.stat`'s ValueError)."""
    if type(value) is not str:  # the common case: a plain str needs no ABC check
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise InputError(f"{name} must be a path (a str or os.PathLike), not {type(value).__name__} ({value!r})")
    if "\x00" in value:
        raise InputError(f"{name} {value!r} holds a NUL character, which no file system path can")
    return value


_STORED_TIME = re.compile(STORED_TIME)
_EXAMPLE_TIME = "2026-11-30T12:00:00.000000Z"


def recorded_time(reading: object) -> str:
    """A clock's reading as an event stores it: UTC text `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the one form in which
    `--as-of` can compare times as text."""
    try:
        if isinstance(reading, str) and _STORED_TIME.fullmatch(reading):
            dt.datetime.fromisoformat(reading[:-1])  # a real moment: no month 13, no 25:00
            return reading
    except ValueError:
        pass
    raise InputError(f"the ledger's clock gave {reading!r}: an event's time is UTC text like {_EXAMPLE_TIME}")


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def default_id(fields: JSON, manifest_path: str | os.PathLike[str]) -> str:
    """The manifest's policy_version; without a usable one, the manifest's path as given (the candidate is
    received under it and its check rejects it: a semantic problem, not an input error)."""
    version = fields.get("policy_version")
    if is_identity(version):
        return str(version)
    return Path(os.path.normpath(manifest_path)).as_posix()


def suggest(word: object, choices: Iterable[str], listed: Iterable[str] | None = None) -> str:
    """`, did you mean 'x'?` for the closest of `choices`, then the choices (or `listed`) themselves."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1) if isinstance(word, str) else []
    return (f", did you mean {close[0]!r}?" if close else "") + f" (expected one of {', '.join(listed or choices)})"


def require_choice(what: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise InputError(f"unknown {what} {value!r}{suggest(value, choices)}")


def require_baseline(settings: LedgerSettings) -> None:
    if settings.baseline is None:
        raise ConflictError("no active baseline: run `lifecycle baseline activate SFT_MANIFEST` first")


def checked_options(actor: object, artifact_root: object, retry: object, cached_candidates: object) -> str | None:
    """The constructor's argument checks (InputError); the artifact root made absolute."""
    if actor:  # an empty one means the default
        check_actor(text_or_error("actor", actor) if isinstance(actor, str) else actor)  # a NUL said as such
    if not isinstance(retry, RetryPolicy):  # else every command would fail on `retry.deadline`
        raise InputError(f"retry must be a RetryPolicy, not {type(retry).__name__} ({retry!r})")
    check_cache_size(cached_candidates)
    return None if artifact_root is None else os.path.abspath(path_argument("artifact_root", artifact_root))


def read_only_folder(target: str | os.PathLike[str]) -> StoreError | None:
    """Why an existing ledger file could not be opened to write, when its folder may not be written (SQLite
    keeps the `-wal` and `-shm` beside the file); None for anything else."""
    from lifecycle_fsm.store.open import is_postgres_url

    if is_postgres_url(target):
        return None
    path = os.fspath(target)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if not os.path.isfile(real) or os.access(folder, os.W_OK):
        return None
    return StoreError(
        f"{path}: cannot open the ledger to write: its folder {folder} is read-only for this process (a Ledger "
        "writes, and SQLite keeps the ledger's -wal and -shm files beside it); to read it, use "
        "Ledger.open(path, create=False) (reads work, writes are refused) or the CLI's read commands "
        "(status, log, explain, verify)"
    )


def check_key(event_id: object) -> None:
    """An idempotency key is a string (or None): anything else is refused before it is looked up."""
    if event_id is None:
        return
    if not isinstance(event_id, str):
        raise InputError(f"event_id must be a string, not {type(event_id).__name__} ({event_id!r})")
    text_or_error("event_id", event_id)
