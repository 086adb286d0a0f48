"""One store, one thread: a SQLite or PostgreSQL store is used by the thread that opened it.

A store holds one database connection and per-connection state (the write
transaction, the chain's head, PostgreSQL's prepared statements and pipeline). Two
threads sharing one would interleave their statements: on PostgreSQL, one thread read
the other's answers from the pipeline (a raw `IndexError`, then a closed connection,
measured with 4 threads). `sqlite3` refuses a connection used from another thread by
itself; the PostgreSQL store checks the same at the entry of every public method, and
both stores' transaction objects at the entry of theirs (before any state changes or
anything is sent, so a refused call cannot start, empty or roll back the owner's
transaction), and the PostgreSQL session again before each statement (a row generator
handed to another thread), and `transaction()` once more when it is entered. Both say it
the same way, as an `InputError`: the caller's misuse, nothing was written. Concurrent
writers each open their own store (the database keeps them apart, README "Concurrency").
The memory store holds no connection and takes a lock: threads may share it.
"""

from __future__ import annotations

import functools
import inspect
from _thread import get_ident  # `threading.get_ident` itself, without importing `threading` at start-up
from collections.abc import Callable
from typing import Any, TypeVar

from store.errors import InputError

__all__ = ["ThreadOwner", "one_thread", "wrong_thread"]

_C = TypeVar("_C", bound=type)


def wrong_thread(where: object) -> InputError:
    """The error for a store used from a thread other than the one that opened it."""
    return InputError(
        f"{where}: this ledger store was opened in another thread; a store (and a Ledger) is used by "
        "the thread that opened it: open one per thread"
    )


class ThreadOwner:
    """The thread that opened a store, and the check every use makes."""

    __slots__ = ("ident", "where")

    def __init__(self, where: object) -> None:
        self.ident = get_ident()
        self.where = where

    def check(self) -> None:
        if get_ident() != self.ident:
            raise wrong_thread(self.where)


def one_thread(cls: _C) -> _C:
    """Check the instance's `_owner` (a `ThreadOwner`) on entry to every public method (`close` too,
    as `sqlite3` does: the owner closes what it opened; another thread stops a follower with its
    `stop` event)."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _checked(member))
    return cls


def _checked(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        if get_ident() != owner.ident:
            raise wrong_thread(owner.where)
        return method(self, *args, **kwargs)

    return checked
