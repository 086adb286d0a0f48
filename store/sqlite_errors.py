"""Translating what `sqlite3` raises into the project's error tree: nothing from `sqlite3` crosses the
store's API. A damaged file fails in many ways; a value that is not valid UTF-8 means the data was
altered (`IntegrityError`), use from another thread is misuse (`InputError`), anything else means the
file is unusable (`StoreError`)."""

from __future__ import annotations

import sqlite3

from lifecycle_fsm.errors import IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.sql import derived_table_dropped
from lifecycle_fsm.store.threads import wrong_thread

__all__ = ["SQLITE_FAILURES", "translate_sqlite_error"]

SQLITE_FAILURES = (sqlite3.DatabaseError, UnicodeDecodeError)
_MAX_DETAIL = 200  # a decode error quotes the whole damaged value; one line is enough


def translate_sqlite_error(error: BaseException, where: object) -> LifecycleError:
    detail = " ".join(str(error).split())
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL] + "…"
    if isinstance(error, sqlite3.ProgrammingError) and "same thread" in detail:
        return wrong_thread(where)
    if isinstance(error, UnicodeDecodeError) or "Could not decode to UTF-8" in detail:
        return IntegrityError(f"{where}: a stored value is not valid UTF-8, the ledger file is damaged ({detail})")
    if "readonly" in detail or "read-only" in detail:
        return StoreError(f"{where}: the ledger database is read-only ({detail})")
    if detail.startswith("no such table: ") and (dropped := derived_table_dropped(where, detail[15:], detail)):
        return dropped
    return StoreError(f"{where}: the ledger database failed, it may be damaged or not a ledger ({detail})")
