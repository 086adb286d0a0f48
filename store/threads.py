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

Nor across `fork()`: a child process that inherits an open store shares its connection's socket
(PostgreSQL: parent and child read each other's answers, and a child's close sends the server a
Terminate that ends the parent's session) or its file locks and WAL index (SQLite says a
connection must not be carried across fork; its close in the child would roll back through the
shared WAL index). An `os.register_at_fork` hook marks every open store in the child: the
owner's thread id becomes one no thread has, so the check every call already makes refuses the
call, naming the process that opened it, at no cost to any call (a `getpid()` per call would be a
system call each); a store's `on_fork` then detaches what the child must not use
(`SQLiteEventStore`: its connection is never used, closed or freed there; psycopg already never
closes a connection it frees in another process). `close()` in the child closes nothing: the
connection is the parent's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import weakref
from _thread import get_ident  # `threading.get_ident` itself, without importing `threading` at start-up
from collections.abc import Callable
from typing import Any, TypeVar

from lifecycle_fsm.store.errors import InputError

__all__ = ["ThreadOwner", "one_thread", "wrong_process", "wrong_thread"]

_C = TypeVar("_C", bound=type)
_NO_THREAD = -1  # a forked child's owner: `get_ident()` is never negative


def wrong_thread(where: object) -> InputError:
    """The error for a store used from a thread other than the one that opened it."""
    return InputError(
        f"{where}: this ledger store was opened in another thread; a store (and a Ledger) is used by "
        "the thread that opened it: open one per thread"
    )


def wrong_process(where: object, pid: int) -> InputError:
    """The error for a store used in a process forked after it was opened."""
    return InputError(
        f"{where}: this ledger was opened in process {pid}, before a fork; a store (and a Ledger) is not "
        "carried across fork(): open it again in this process"
    )


class ThreadOwner:
    """The thread (and process) that opened a store, and the check every use makes."""

    __slots__ = ("__weakref__", "forked", "ident", "on_fork", "pid", "where")

    def __init__(self, where: object, on_fork: Callable[[], None] | None = None) -> None:
        self.ident = get_ident()
        self.pid = os.getpid()
        self.where = where
        self.forked = False
        self.on_fork = on_fork  # run in a forked child: detach the store's connection there
        _OPEN.add(self)

    def check(self) -> None:
        if get_ident() != self.ident:
            raise self.refusal()

    def refusal(self) -> InputError:
        """Why a call is refused: another thread, or (`forked`) another process."""
        return wrong_process(self.where, self.pid) if self.forked else wrong_thread(self.where)

    def release(self) -> None:
        """The store is closed: nothing to detach in a later fork's child."""
        self.on_fork = None
        _OPEN.discard(self)


_OPEN: weakref.WeakSet[ThreadOwner] = weakref.WeakSet()  # the owners of stores not closed yet


def _in_forked_child() -> None:
    """Every store open at the fork is refused in the child, and its connection detached there."""
    for owner in list(_OPEN):
        owner.ident = _NO_THREAD
        owner.forked = True
        detach, owner.on_fork = owner.on_fork, None
        if detach is not None:
            with contextlib.suppress(Exception):  # a hook must not break the child; the refusal stands anyway
                detach()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_in_forked_child)


def one_thread(cls: _C) -> _C:
    """Check the instance's `_owner` (a `ThreadOwner`) on entry to every public method (`close` too,
    as `sqlite3` does: the owner closes what it opened; another thread stops a follower with its
    `stop` event). In a forked child every call is refused but `close`, which closes nothing there."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _checked(member, closing=name == "close"))
    return cls


def _checked(method: Callable[..., Any], *, closing: bool = False) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        if get_ident() != owner.ident:
            if closing and owner.forked:
                return None  # the parent's connection: left to the parent
            raise owner.refusal()
        return method(self, *args, **kwargs)

    return checked
