"""What a Ledger's store becomes once it is closed: every call is a `LedgerClosedError`.

Without it a closed SQLite ledger would let `sqlite3.ProgrammingError` reach the
caller, and a closed PostgreSQL one a driver error: neither is in the error tree.
"""

from __future__ import annotations

from typing import NoReturn, cast

from lifecycle_fsm.errors import LedgerClosedError
from lifecycle_fsm.store.base import EventStore

__all__ = ["ClosedStore", "closed_store"]


class ClosedStore:
    """Stands in for a closed store; closing it again is allowed and does nothing."""

    def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> NoReturn:
        raise LedgerClosedError(f"this ledger is closed: open it again to use it (called {name})")


def closed_store() -> EventStore:
    return cast(EventStore, ClosedStore())
