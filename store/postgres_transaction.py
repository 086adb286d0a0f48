"""A write transaction on the PostgreSQL store: BEGIN and the lock go with its first message.

Statements go several to a message, their values bound client-side (psycopg's `ClientCursor`), and
an append's inserts wait for the next message or the COMMIT: a one-append command is two round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus

from lifecycle_fsm.store.chain import EVENT_COLUMNS
from lifecycle_fsm.store.postgres_session import COMMIT_UNKNOWN, NOTHING_COMMITTED
from lifecycle_fsm.store.records import Row
from lifecycle_fsm.store.sql import RECORD_FIRST, SQLTransaction
from lifecycle_fsm.store.writes import id_taken

if TYPE_CHECKING:
    from lifecycle_fsm.store.postgres import PostgresEventStore

_ROWS_PER_INSERT = 1000


class PostgresTransaction(SQLTransaction):
    """A write transaction: BEGIN and the lock go with its first message, its inserts with the next one."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._session = store.session
        self._owner = store.session.owner
        self._fault = store._fault
        self.started = False
        self.wrote = False
        self._pending: list[tuple[str, Sequence[Any]]] = []  # statements sent ahead of the next message
        self._inserting: tuple[str, int] | None = None  # the stream and version the pending rows follow

    def _send(self, statements: Sequence[tuple[str, Sequence[Any]]], *, lost: str = NOTHING_COMMITTED) -> list[Any]:
        """`statements` in one message after what is pending (and, first, BEGIN and the lock); each one's rows.
        One statement text (psycopg caches its parsing by the text) with every statement's values in order."""
        session, first = self._session, not self.started
        parts = ([("BEGIN", ()), (session.lock_sql, ())] if first else []) + self._pending
        skip = len(parts)
        parts += statements
        self.started, self._pending, inserting, self._inserting = True, [], self._inserting, None
        with session.mapped("write transaction failed", lost=lost):
            cursor = session.batch
            try:
                cursor.execute("; ".join(sql for sql, _ in parts), [v for _, params in parts for v in params])
            except pg_errors.UniqueViolation as e:
                if inserting is None:
                    raise
                self.failed = f"an append to {inserting[0]!r} failed part-way"
                raise id_taken(*inserting, session.scrub(str(e).splitlines()[0])) from e
            results: list[Any] = []
            for n in range(len(parts)):
                if n >= skip:
                    result = cursor.pgresult
                    ok = result is not None and result.status == ExecStatus.TUPLES_OK
                    results.append(cursor.fetchall() if ok else [])
                cursor.nextset()
        if first and self._fault is not None:  # BEGIN and the lock answered: the write lock is held
            self._fault.reached("after_begin")
        return results

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._owner.check()  # before `_send` changes any state
        rows: list[Any] = self._send([(sql, params)])[0]
        return rows

    def _head_and_ids(self, sql: str, params: Sequence[Any], ids: Sequence[str]) -> tuple[Row, list[Row]]:
        self._owner.check()
        statements: list[tuple[str, Sequence[Any]]] = [(sql, params)]
        if ids:  # in the same message
            statements.append((f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY(%s::text[])", (list(ids),)))
        results = self._send(statements)
        return results[0][0], results[1] if ids else []

    def _record_first(self, digest: str) -> None:
        if self._session.may_record:  # a role that may only SELECT from meta leaves it to the owner's next open
            self._pending.append((RECORD_FIRST, (digest,)))

    def _insert(self, rows: list[Row]) -> None:
        for at in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[at : at + _ROWS_PER_INSERT]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            self._pending.append(
                (f"INSERT INTO events ({EVENT_COLUMNS}) VALUES {values}", [v for r in chunk for v in r])
            )
        self._inserting, self.wrote = (rows[0][1], rows[0][2] - 1), True

    def flush(self) -> None:
        """Send what is pending now (the fault hooks strike with the rows inserted)."""
        if self._pending:
            self._send([])

    def commit(self) -> None:
        """What is pending, NOTIFY if anything was appended, and COMMIT, in one message."""
        self.may_commit()
        if self.started or self._pending:
            notify = [(self._session.notify_sql, ())] if self.wrote else []
            self._send([*notify, ("COMMIT", ())], lost=COMMIT_UNKNOWN)
