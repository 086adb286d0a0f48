"""The SQLite event store: one append-only, hash-chained table of events in one file.

- WAL lets readers run while one writer appends; every write takes the lock up front (`BEGIN
  IMMEDIATE`), so the versions it checks and the head it extends cannot move under it.
- The lock is waited for in short jittered steps (`sqlite_files.begin_immediate`), so a write sets
  the busy timeout to 0; the next read puts it back (a read can meet a lock too).
- sqlite-utils creates the schema; an existing ledger is used with plain statements (sqlite-utils
  inspects the schema on every insert, and importing it doubles a read command's start-up).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any

from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.store.base import (
    Transactions,
    id_taken,
    snapshot_in_write,
    write_in_read_snapshot,
    write_in_transaction,
)
from lifecycle_fsm.store.chain import EVENT_COLUMNS
from lifecycle_fsm.store.open import busy_timeout_seconds, synchronous_mode
from lifecycle_fsm.store.records import ALL_EVENTS, CheckpointRecord, EventFilter, Row, StreamHead, StreamShare
from lifecycle_fsm.store.sql import CHECKPOINTS, RECORD_FIRST, Run, SQLStore, SQLTransaction
from lifecycle_fsm.store.sqlite_files import (
    SQLITE_FAILURES,
    ImmutableRead,
    OpenedFiles,
    begin_immediate,
    close_without_checkpoint,
    create_ledger_file,
    keep_for_good,
    on_read_only_media,
    translate_sqlite_error,
)
from lifecycle_fsm.store.sqlite_schema import (
    SYNCHRONOUS_MODES,
    ensure_derived_tables,
    ensure_schema,
    filter_sql,
    fold_sql,
    guard_problems,
    schema_version,
)
from lifecycle_fsm.store.threads import ThreadOwner, fault_from_env, one_thread

_ROWS_PER_INSERT = 64  # multi-row INSERTs of up to 64 rows: fewer statements than one per row


def _sqlite(sql: str) -> str:
    """A shared statement (`store.sql`, `%s` placeholders) in SQLite's placeholders."""
    return sql.replace("%s", "?")


def _insert_sql(rows: int) -> str:
    return f"INSERT OR FAIL INTO events ({EVENT_COLUMNS}) VALUES " + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * rows)


class SQLiteTransaction(SQLTransaction):
    """A write transaction on the SQLite store, under `BEGIN IMMEDIATE`."""

    def __init__(self, conn: sqlite3.Connection, owner: ThreadOwner) -> None:
        self._conn = conn
        self._owner = owner

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._owner.check()  # before `sqlite3` would: the refusal is said as on PostgreSQL
        return self._conn.execute(_sqlite(sql), params).fetchall()

    def _head_and_ids(self, sql: str, params: Sequence[Any], ids: Sequence[str]) -> tuple[Row, list[Row]]:
        row, stored = self._rows(sql, params)[0], []
        for at in range(0, len(ids), 500):
            chunk = ids[at : at + 500]
            stored += self._rows(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id IN ({', '.join(['%s'] * len(chunk))})", chunk
            )
        return row, stored

    def _record_first(self, digest: str) -> None:
        self._conn.execute(_sqlite(RECORD_FIRST), (digest,))

    def _insert(self, rows: list[Row]) -> None:
        execute = self._conn.execute
        try:
            for at in range(0, len(rows), _ROWS_PER_INSERT):
                chunk = rows[at : at + _ROWS_PER_INSERT]
                execute(_insert_sql(len(chunk)), list(chain.from_iterable(chunk)))
        except sqlite3.IntegrityError as e:
            raise id_taken(rows[0][1], rows[0][2] - 1, e) from e


@one_thread
class SQLiteEventStore(SQLStore, Transactions[SQLiteTransaction]):
    """An `EventStore` in one SQLite file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        create: bool = True,
    ) -> None:
        mode = synchronous_mode(synchronous, SYNCHRONOUS_MODES)
        self._busy_timeout = busy_timeout_seconds(busy_timeout)
        self.path = Path(path)
        self._fault = fault_from_env()
        # In a forked child the inherited connection is never used, closed or freed.
        self._owner = ThreadOwner(self.path, lambda: keep_for_good(self._conn))
        self._private = str(path) in ("", ":memory:")  # nobody else can reach it: never wait
        self._quick = self._private  # the busy timeout is 0 (a write set it; the next read gives it back)
        self._held: str | None = None  # "write" or "snapshot": the block holding the connection's transaction
        self._immutable: ImmutableRead | None = None  # a ledger in a folder we may not write
        self._files: OpenedFiles | None = None  # the files a write must still be writing into
        if create:
            create_ledger_file(self.path)
        try:
            timeout = 0 if self._private else busy_timeout
            self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot open the ledger database ({e})") from e
        try:
            found = schema_version(self._conn) if create else self._first_read()
            if found is None and not create:  # before any PRAGMA: WAL mode would write into an empty file
                raise StoreError(f"{self.path}: not a ledger (no lifecycle schema); a read never creates one")
            # Makes `INSERT OR REPLACE` fire the delete trigger that refuses it.
            self._conn.execute("PRAGMA recursive_triggers=ON")
            if self._immutable is None:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute(f"PRAGMA synchronous={mode}")
            ensure_schema(self._conn, self.path, found, self._write)
            self._indexed = ensure_derived_tables(self._conn, self._immutable is None and create, self._write)
            if self._immutable is None and not self._private:
                self._files = OpenedFiles(self.path)
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise StoreError(f"{self.path}: not a usable ledger database ({e})") from e
        except UnicodeDecodeError as e:  # a flipped byte in the schema's own text
            self._conn.close()
            raise translate_sqlite_error(e, self.path) from e
        except BaseException:
            self._conn.close()
            raise

    def _first_read(self) -> str | None:
        """The schema version of a ledger that must exist; one on read-only media is read immutable."""
        try:
            return schema_version(self._conn)
        except sqlite3.OperationalError as e:
            if not on_read_only_media(self.path, e):
                raise
        self._conn.close()
        self._immutable = ImmutableRead(self.path)
        self._conn = self._immutable.conn
        return schema_version(self._conn)

    # --- the connection's transaction -----------------------------------------------------

    def _ready_to_read(self) -> None:
        """Before each read: an immutable file must still be the one opened, a transaction no block holds (an
        interrupt cut its cleanup short) is ended, and the busy timeout a write set to 0 is put back."""
        if self._immutable is not None:
            self._immutable.check()
        if self._held is None and self._conn.in_transaction:
            self._rollback()
        if self._quick and not self._private:
            self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            self._quick = False

    def _may_catch_up(self) -> bool:
        return self._held is None and self._immutable is None

    def _rollback(self) -> None:
        if self._owner.forked:  # the parent's transaction: never ended from a forked child
            return
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.ProgrammingError:  # closed meanwhile: closing rolled it back
            pass

    @contextmanager
    def _write(self, *, command: bool = False) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT; a command's commit is where the fault hooks sit."""
        self._owner.check()  # entered (not only made) by the owner: another thread must not end its transaction
        if self._held is not None:
            raise write_in_read_snapshot(self.path) if self._held == "snapshot" else write_in_transaction(self.path)
        conn, fault = self._conn, self._fault if command else None
        try:
            try:
                self._rollback()  # one an interrupted cleanup left open
                if not self._quick:  # the lock is waited for in our own steps, never by SQLite's sleeps
                    conn.execute("PRAGMA busy_timeout = 0")
                    self._quick = True
                begin_immediate(conn, self._busy_timeout, self.path)
                self._held = "write"
                if fault is not None:
                    fault.reached("after_begin")
                yield conn
                if fault is not None:
                    fault.reached("before_commit")
                self._owner.check()  # a forked child inside the parent's transaction: never its COMMIT
                if self._files is not None:
                    self._files.check()
                conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            finally:
                self._held = None
        except SQLITE_FAILURES as e:
            raise translate_sqlite_error(e, f"{self.path}: write failed") from e
        if fault is not None:
            fault.reached("after_commit")

    @contextmanager
    def _locked(self, what: str) -> Iterator[Run]:
        with self._write() as conn:

            def run(sql: str, params: Sequence[Any] = (), many: bool = False) -> list[Any]:
                if many:
                    conn.executemany(_sqlite(sql), params)
                    return []
                return conn.execute(_sqlite(sql), params).fetchall()

            yield run

    @contextmanager
    def transaction(self) -> Iterator[SQLiteTransaction]:
        with self._write(command=True) as conn:
            tx = SQLiteTransaction(conn, self._owner)
            yield tx
            tx.may_commit()

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One deferred read transaction: WAL keeps its snapshot while others commit, never blocking them."""
        self._owner.check()
        if self._held == "snapshot":
            yield
            return
        if self._held == "write":
            raise snapshot_in_write(self.path)
        try:
            try:
                self._ready_to_read()
                self._conn.execute("BEGIN")
                self._held = "snapshot"
                yield
            finally:
                self._held = None
                self._rollback()  # nothing was written: ending it is all there is to do
        except SQLITE_FAILURES as e:
            raise translate_sqlite_error(e, f"{self.path}: read snapshot failed") from e
        if self._immutable is not None:  # what the snapshot read must still be the file's content
            self._immutable.check()

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        """A derived table dropped by hand is first made again, empty: `replay --full` is its repair."""
        self._indexed = ensure_derived_tables(self._conn, self._immutable is None, self._write)
        super().rebuild_stream_index(derive)

    # --- reads ----------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            self._ready_to_read()
            yield self._conn
        except SQLITE_FAILURES as e:
            raise translate_sqlite_error(e, self.path) from e

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._reading() as conn:
            return conn.execute(_sqlite(sql), params).fetchall()

    def _batches(self, sql: str, params: Sequence[Any], size: int) -> Iterator[list[Any]]:
        """A read's rows in `fetchmany` batches, one SELECT (one read snapshot), memory flat as the log grows."""
        with self._reading() as conn:
            cursor = conn.execute(_sqlite(sql), params)
            while True:
                self._owner.check()  # a read carried into another thread or a forked child stops there
                rows = cursor.fetchmany(size)
                if not rows:
                    return
                yield rows

    def select_rows(self, query: EventFilter = ALL_EVENTS) -> Iterator[list[Row]]:
        """Small batches on purpose: a row is hashed and folded while its payload is still in the CPU cache."""
        if self._indexed and not query.positions_only():
            self._catch_up_before_read()
        return self._batches(*filter_sql(query, indexed=self._indexed), 256)

    def select_fold_rows(
        self, *, after: int, before: int | None, streams: StreamShare | None = None
    ) -> Iterator[list[Row]]:
        """As `select_rows` of the slice, five columns fewer to fetch and convert."""
        return self._batches(*fold_sql(after, before, streams), 256)

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        """One row at a time, newest first (a load stops at the first trusted one); without a bound every
        row, also one whose position was edited into no seq (its reader judges it broken)."""
        where, params = ("", ()) if at_or_before is None else (" WHERE position <= %s", (at_or_before,))
        for rows in self._batches(f"{CHECKPOINTS}{where} ORDER BY position DESC, checkpoint_id DESC", params, 1):
            yield CheckpointRecord(*rows[0])

    def guard_problems(self) -> list[str]:
        with self._reading() as conn:
            return guard_problems(conn)

    def close(self) -> None:
        self._owner.release()
        if self._files is not None and self._files.changed() is not None:
            close_without_checkpoint(self._conn, self._files)
            return
        self._conn.close()
