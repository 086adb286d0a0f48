"""Translating what `sqlite3` raises into the project's error tree, on every store method.

A damaged ledger file makes `sqlite3` fail in many places and many ways: a dropped
table or renamed column (`OperationalError: no such …`), a flipped byte inside a
text value (`OperationalError: Could not decode to UTF-8`, or a bare
`UnicodeDecodeError` from the schema text), a malformed page, a read-only file. The
store promises that nothing from `sqlite3` crosses its API, so every public method
(and every generator a method returns, since rows are fetched lazily) is wrapped once
here rather than at each statement: a new statement cannot forget it. The same wrapper
runs the store's preparation for a read (its busy timeout) before every public method
that is not a write: a new read cannot forget that either.

    not valid UTF-8 in a stored value   IntegrityError  (exit 6: the data was altered)
    used from another thread            InputError      (store/threads.py)
    any other sqlite3.DatabaseError     StoreError      (exit 7: the file is unusable)
"""

from __future__ import annotations

import functools
import inspect
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from lifecycle_fsm.store.errors import IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.threads import wrong_thread

__all__ = ["SQLITE_FAILURES", "translate_sqlite_error", "translating_sqlite_errors"]

SQLITE_FAILURES = (sqlite3.DatabaseError, UnicodeDecodeError)
_MAX_DETAIL = 200  # a decode error quotes the whole damaged value; one line is enough

_C = TypeVar("_C", bound=type)


def translate_sqlite_error(error: BaseException, where: object) -> LifecycleError:
    """The project error for one `sqlite3` failure on the ledger at `where`."""
    detail = " ".join(str(error).split())
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL] + "…"
    if isinstance(error, sqlite3.ProgrammingError) and "same thread" in detail:
        return wrong_thread(where)  # sqlite3's own check: said as the PostgreSQL store says it
    if isinstance(error, UnicodeDecodeError) or "Could not decode to UTF-8" in detail:
        return IntegrityError(f"{where}: a stored value is not valid UTF-8, the ledger file is damaged ({detail})")
    if "readonly" in detail or "read-only" in detail:
        return StoreError(f"{where}: the ledger database is read-only ({detail})")
    return StoreError(f"{where}: the ledger database failed, it may be damaged or not a ledger ({detail})")


def _wrap_iterator(it: Iterator[Any], where: Callable[[], object]) -> Iterator[Any]:
    try:
        yield from it
    except SQLITE_FAILURES as e:
        raise translate_sqlite_error(e, where()) from e


def _wrap(method: Callable[..., Any], before: Callable[[Any], None] | None) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            if before is not None:  # when the first row is asked for: just before the first statement
                try:
                    before(self)
                except SQLITE_FAILURES as e:
                    raise translate_sqlite_error(e, self.path) from e
            return (yield from _wrap_iterator(method(self, *args, **kwargs), lambda: self.path))

        return generator

    @functools.wraps(method)
    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if before is not None:
                before(self)
            return method(self, *args, **kwargs)
        except SQLITE_FAILURES as e:
            raise translate_sqlite_error(e, self.path) from e

    return plain


def translating_sqlite_errors(*, before_reads: str, writes: Iterable[str]) -> Callable[[_C], _C]:
    """Wrap every public method of a class; a context manager (`transaction`) translates its own body.

    Every public method but the `writes` first calls the method named `before_reads`
    (the SQLite store gives reads their busy timeout back there).
    """
    skip = frozenset(writes)

    def decorate(cls: _C) -> _C:
        before = getattr(cls, before_reads)
        for name, member in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(member):
                setattr(cls, name, _wrap(member, None if name in skip else before))
        return cls

    return decorate
