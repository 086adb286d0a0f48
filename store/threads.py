"""One store, one thread, one process: a SQLite or PostgreSQL store is used where it was opened; and
precise crash injection for drills and reliability tests (a testing aid): `LIFECYCLE_FAULT`.

Two threads sharing one connection would interleave their statements, and a forked child would share
its socket or its file locks and WAL index. So every public method of a store and of its transactions
first checks the caller (an `InputError`, before any state changes or anything is sent: a refused
call cannot end the owner's transaction). A fork hook marks every open store in the child, which
then refuses every call and runs the store's `on_fork`. The memory store takes a lock instead.

`LIFECYCLE_FAULT`: `kill@P` SIGKILLs the process, `int@P` sends it SIGINT (which an embedder may handle)
at a point P: `after_begin` (the write lock taken, nothing inserted), `before_commit` (a command's rows
inserted) or `after_commit` (before the append returns). A `#N` suffix fires at the Nth time the process
reaches P instead of the first. Read once when a store opens; unset, it costs an `is None` test.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from lifecycle_fsm.errors import InputError

_C = TypeVar("_C", bound=type)

ENV_VAR = "LIFECYCLE_FAULT"
_POINTS = ("before_commit", "after_commit", "after_begin")
_ACTIONS = ("kill", "int")


@attrs.define
class _FaultPlan:
    """Which point to signal at, on which pass, and how."""

    point: str
    nth: int
    action: str = "kill"
    _seen: int = 0

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self._seen += 1
        if self._seen == self.nth:
            import signal  # here, not at import: every store open would pay for its enums

            os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGINT)


def fault_from_env() -> _FaultPlan | None:
    """Parse `LIFECYCLE_FAULT`; an unknown value is an error, never ignored."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return None
    spec, _, count = raw.partition("#")
    action, _, point = spec.partition("@")
    if action not in _ACTIONS or point not in _POINTS:
        choices = ", ".join(f"{a}@{p}" for a in _ACTIONS for p in _POINTS)
        raise InputError(f"{ENV_VAR}={raw!r} is not one of {choices}")
    try:
        nth = int(count) if count else 1
    except ValueError:
        raise InputError(f"{ENV_VAR}={raw!r}: the part after '#' must be a commit number") from None
    if nth < 1:
        raise InputError(f"{ENV_VAR}={raw!r}: the commit number must be at least 1")
    return _FaultPlan(point, nth, action)


def wrong_thread(where: object) -> InputError:
    return InputError(
        f"{where}: this ledger store was opened in another thread; a store (and a Ledger) is used by "
        "the thread that opened it: open one per thread"
    )


def wrong_process(where: object, pid: int) -> InputError:
    return InputError(
        f"{where}: this ledger was opened in process {pid}, before a fork; a store (and a Ledger) is not "
        "carried across fork(): open it again in this process"
    )


class ThreadOwner:
    """The thread (and process) that opened a store, and the check every use makes."""

    def __init__(self, where: object, on_fork: Callable[[], None] | None = None) -> None:
        self.ident: int | None = threading.get_ident()  # None in a forked child: no thread owns it there
        self.pid = os.getpid()
        self.where = where
        self.on_fork = on_fork
        _OPEN.add(self)

    @property
    def forked(self) -> bool:
        return self.ident is None

    def check(self) -> None:
        if threading.get_ident() != self.ident:
            raise self.refusal()

    def refusal(self) -> InputError:
        return wrong_process(self.where, self.pid) if self.forked else wrong_thread(self.where)

    def release(self) -> None:
        """The store is closed: nothing to do for it in a later fork's child."""
        _OPEN.discard(self)


_OPEN: weakref.WeakSet[ThreadOwner] = weakref.WeakSet()


def _in_forked_child() -> None:
    for owner in list(_OPEN):
        owner.ident = None
        if owner.on_fork is not None:
            with contextlib.suppress(Exception):  # a hook must not break the child; the refusal stands anyway
                owner.on_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_in_forked_child)


def one_thread(cls: _C) -> _C:
    """Check the instance's `_owner` on entry to every public method (its bases' too). In a forked
    child every call is refused but `close`, which closes nothing there (the connection is the parent's)."""
    for name in dir(cls):
        method = getattr(cls, name)
        if not name.startswith("_") and inspect.isfunction(method):
            setattr(cls, name, _checked(method, closing=name == "close"))
    return cls


def _checked(method: Callable[..., Any], *, closing: bool) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        owner: ThreadOwner = self._owner
        if closing and owner.forked:
            return None
        owner.check()
        return method(self, *args, **kwargs)

    return checked
