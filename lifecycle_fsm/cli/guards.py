"""The refusals every command that opens a ledger makes first, and the errors of a stdout that cannot be written."""

from __future__ import annotations

import os
import sqlite3
import stat

from lifecycle_fsm.errors import InputError, StoreError
from lifecycle_fsm.store.open import is_postgres_url

__all__ = ["closed_output", "is_driver_error", "output_error", "refuse_empty_file", "refuse_memory_db"]


def refuse_memory_db(db: str, what: str = "--db") -> None:
    """`--db :memory:` (or an empty name: a temporary file) would acknowledge writes that vanish."""
    if db in ("", ":memory:") or db.startswith("file::memory:"):
        raise InputError(f"{what} {db!r} is an in-memory database: every write would vanish when the command ends")


def refuse_empty_file(db: str, *, allow_empty: bool = False) -> None:
    """An existing empty file is not a ledger: only `init` (`allow_empty`) may make one there.

    A folder, a FIFO or a device is never one, and is named as what it is (a FIFO reads as empty).
    """
    if is_postgres_url(db):
        return
    try:
        found = os.stat(db)
    except OSError:  # missing (created by a write command) or unreadable (the store says why)
        return
    if stat.S_ISDIR(found.st_mode):
        raise StoreError(
            f"{db}: a folder, not a ledger file; name the ledger file itself (e.g. {os.path.join(db, 'lifecycle.db')})"
        )
    if not stat.S_ISREG(found.st_mode):
        raise StoreError(f"{db}: not a regular file (a FIFO, device or socket); a ledger is a regular file")
    if found.st_size == 0 and not allow_empty:
        raise StoreError(f"{db}: an empty file, not a ledger (was it truncated?); `lifecycle init` creates one here")


def is_driver_error(error: BaseException) -> bool:
    """An exception raised by sqlite3 or psycopg (checked by module: psycopg may not be installed)."""
    return isinstance(error, sqlite3.DatabaseError) or type(error).__module__.split(".")[0] == "psycopg"


def output_error(error: OSError) -> InputError | None:
    """The error to report when writing the command's output failed (a full disk, a closed or
    broken stdout), else None: such an `OSError` is raised inside click's `echo` or rich's
    console, and must be one `Error:` line (exit 3), not a traceback. A write command prints
    after its commit, so the message says where its events are."""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if (code.co_name == "echo" and code.co_filename.endswith(os.path.join("click", "utils.py"))) or (
            code.co_filename.endswith(os.path.join("rich", "console.py"))
        ):
            return closed_output(error.strerror or str(error))
        tb = tb.tb_next
    return None


def closed_output(why: str) -> InputError:
    return InputError(
        f"cannot write the output ({why}); a write command appends before it prints: `lifecycle log` shows its events"
    )
