"""What a Ledger's store becomes once closed: every call a `LedgerClosedError`, never a driver's error.

A Ledger may be closed from another thread (a shutdown handler ending a blocked `follow()`). The
connection belongs to the opening thread, so it is held here and closed by that thread: when its
`follow()` ends, or at its next call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NoReturn, TypeVar

from lifecycle_fsm.errors import LedgerClosedError
from lifecycle_fsm.store.base import EventStore

__all__ = ["CLOSED", "ClosedStore", "closing_after", "require_open"]

T = TypeVar("T")
CLOSED = "this ledger is closed: open it again to use it"


class ClosedStore:
    """Stands in for a closed store; closing it again only closes the connection it still holds (`pending`),
    once, from the thread that opened it."""

    def __init__(self, pending: EventStore | None, opener: int) -> None:
        self._pending = pending
        self._opener = opener

    def close(self) -> None:
        pending = self._pending
        if pending is not None and threading.get_ident() == self._opener:
            self._pending = None
            pending.close()

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):  # copy, pickle and friends look for these: not a call on the ledger
            raise AttributeError(name)
        self.close()
        raise LedgerClosedError(CLOSED)


def require_open(store: object) -> None:
    """LedgerClosedError for a closed ledger's store (closing a connection left to this thread first)."""
    if isinstance(store, ClosedStore):
        store.close()
        raise LedgerClosedError(CLOSED)


def closing_after(events: Iterator[T], ledger: Any) -> Iterator[T]:
    """A `follow()`'s events; when they end because the ledger was closed (from another thread), the
    connection that close left to this thread is closed here."""
    try:
        yield from events
    finally:
        if ledger.closed:
            ledger.store.close()
