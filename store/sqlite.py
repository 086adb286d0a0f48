"""The SQLite event store: one append-only, hash-chained table of events in one file.

Why it is built this way:
- WAL lets readers run while one writer appends. Every write takes the lock up front
  (`BEGIN IMMEDIATE`), so the stream versions it checks and the chain's head it extends
  cannot move under it.
- The lock is waited for in short jittered steps (`_begin_immediate`), not by SQLite's
  busy handler, which sleeps 1, 2, 5, 10 ms… while a command holds the lock for a
  fraction of a millisecond. So a write runs with the connection's busy timeout at 0 and
  leaves it there; the next read puts the store's busy timeout back first (a read can meet
  a lock too, e.g. while another process recovers the WAL).
- sqlite-utils creates the schema (`sqlite_schema.py`) on the store's connection; an
  existing ledger is read and appended to with plain statements (sqlite-utils' `insert`
  inspects the schema on every call, and importing it doubles a read command's start-up).
- Every statement runs inside a block that translates `sqlite3` errors
  (`sqlite_errors.py`); a store is used by the thread that opened it (`threads.py`).
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any

from lifecycle_fsm.errors import InputError, IntegrityError, StoreError
from lifecycle_fsm.store.base import write_in_read_snapshot, write_in_transaction
from lifecycle_fsm.store.chain import GENESIS_HASH
from lifecycle_fsm.store.faults import fault_from_env
from lifecycle_fsm.store.open import busy_timeout_seconds, synchronous_mode
from lifecycle_fsm.store.records import (
    ALL_EVENTS,
    AppendResult,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    Row,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)
from lifecycle_fsm.store.sqlite_errors import SQLITE_FAILURES, translate_sqlite_error
from lifecycle_fsm.store.sqlite_files import ImmutableRead, create_ledger_file, keep_for_good, on_read_only_media
from lifecycle_fsm.store.sqlite_schema import (
    EVENT_COLUMNS,
    STORE_SCHEMA_VERSION,
    SYNCHRONOUS_MODES,
    create_schema,
    filter_sql,
    guard_problems,
    has_events_table,
    schema_version,
)
from lifecycle_fsm.store.threads import ThreadOwner, one_thread
from lifecycle_fsm.store.writes import WriteTransaction, id_taken

__all__ = ["SQLiteEventStore", "SQLiteTransaction", "create_ledger_file"]

_NO_UPPER = 1 << 62
_HEAD = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
_HEAD_SEQ = "(SELECT seq FROM events ORDER BY seq DESC LIMIT 1)"
_HEAD_HASH = "(SELECT hash FROM events ORDER BY seq DESC LIMIT 1)"
_STREAM = f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ? AND version > ? ORDER BY version"
_VERSION = "SELECT version FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1"
_SNAPSHOTS = (
    "SELECT c.checkpoint_id, c.position, c.head_hash, c.schema_version, c.fingerprint, "
    "s.stream_id, s.version, s.state, s.state_sha256 "
    "FROM checkpoint_streams s JOIN checkpoints c ON c.checkpoint_id = s.checkpoint_id"
)
_CHECKPOINTS = (
    "SELECT checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, snapshot_sha256, recorded_at "
    "FROM checkpoints"
)
_UPSERT_STREAM = (
    "INSERT INTO streams (stream_id, version, status, category) VALUES (?,?,?,?) "
    "ON CONFLICT(stream_id) DO UPDATE SET version = excluded.version, "
    "status = coalesce(excluded.status, streams.status), category = coalesce(excluded.category, streams.category)"
)
_ROWS_PER_INSERT = 64  # multi-row INSERTs of up to 64 rows: fewer statements than one per row


def _insert_sql(rows: int) -> str:
    return f"INSERT OR FAIL INTO events ({EVENT_COLUMNS}) VALUES " + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * rows)


class SQLiteTransaction(WriteTransaction):
    """A write transaction on the SQLite store, under `BEGIN IMMEDIATE` (`WriteTransaction` holds the rules)."""

    def __init__(self, conn: sqlite3.Connection, owner: ThreadOwner) -> None:
        self._conn = conn
        self._owner = owner

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        self._owner.check()
        return [StoredEvent(*row) for row in self._conn.execute(_STREAM, (stream_id, after_version))]

    def stream_version(self, stream_id: str) -> int:
        self._owner.check()
        row = self._conn.execute(_VERSION, (stream_id,)).fetchone()
        return int(row[0]) if row else 0

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        self._owner.check()
        return _stream_heads(self._conn, statuses)

    def _read(self, streams: Sequence[str], ids: Sequence[str]) -> tuple[Head, list[int], dict[str, StoredEvent]]:
        self._owner.check()
        columns = [_HEAD_SEQ, _HEAD_HASH] + [f"({_VERSION})"] * len(streams)
        row = self._conn.execute("SELECT " + ", ".join(columns), streams).fetchone()
        stored: dict[str, StoredEvent] = {}
        for at in range(0, len(ids), 500):
            chunk = ids[at : at + 500]
            sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id IN ({','.join('?' * len(chunk))})"
            stored.update((r[3], StoredEvent(*r)) for r in self._conn.execute(sql, chunk))
        head = Head(row[0], row[1]) if row[0] is not None else Head(0, GENESIS_HASH)
        return head, [v or 0 for v in row[2:]], stored

    def _insert(self, rows: list[Row], status: str | None, category: str | None) -> None:
        execute = self._conn.execute
        try:
            for at in range(0, len(rows), _ROWS_PER_INSERT):
                chunk = rows[at : at + _ROWS_PER_INSERT]
                execute(_insert_sql(len(chunk)), list(chain.from_iterable(chunk)))
        except sqlite3.IntegrityError as e:
            raise id_taken(rows[0][1], rows[0][2] - 1, e) from e
        execute(_UPSERT_STREAM, (rows[0][1], rows[-1][2], status, category))


@one_thread
class SQLiteEventStore:
    """An `EventStore` in one SQLite file (see the module docstring for why)."""

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
        self._owner = ThreadOwner(self.path, self._keep_in_child)
        self._private = str(path) in ("", ":memory:")  # nobody else can reach it: never wait
        self._quick = self._private  # the busy timeout is 0 (a write set it; the next read gives it back)
        self._held: str | None = None  # "write" or "snapshot": the block holding the connection's transaction
        self._immutable: ImmutableRead | None = None  # a ledger in a folder we may not write
        if create:
            create_ledger_file(self.path)
        try:
            self._conn = sqlite3.connect(
                str(self.path), timeout=0 if self._private else busy_timeout, isolation_level=None
            )
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot open the ledger database ({e})") from e
        try:
            self._open(mode, create=create)
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise StoreError(f"{self.path}: not a usable ledger database ({e})") from e
        except UnicodeDecodeError as e:  # a flipped byte in the schema's own text
            self._conn.close()
            raise translate_sqlite_error(e, self.path) from e
        except BaseException:
            self._conn.close()
            raise

    def _open(self, mode: str, *, create: bool) -> None:
        found = self._first_read()
        if found is None and not create:
            # Before any PRAGMA: WAL mode alone would write a header into an empty file.
            raise StoreError(f"{self.path}: not a ledger (no lifecycle schema); a read never creates one")
        # Makes `INSERT OR REPLACE` fire the delete trigger that refuses it (sqlite-utils sets it too).
        self._conn.execute("PRAGMA recursive_triggers=ON")
        if self._immutable is None:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={mode}")
        if found is None:
            with self._write():
                found = schema_version(self._conn)  # another process may have created it meanwhile
                if found is None:
                    if has_events_table(self._conn):  # the version went in with the tables: removed by hand since
                        raise StoreError(
                            f"{self.path}: not a ledger (an events table but no store schema version: its meta "
                            "table was dropped or emptied by hand); refusing to write to it"
                        )
                    # Imported only here: it costs a read command's start-up as much again (click, pluggy).
                    import sqlite_utils

                    create_schema(sqlite_utils.Database(self._conn, execute_plugins=False))
                    found = STORE_SCHEMA_VERSION
        if found != STORE_SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing to guess"
            )

    def _first_read(self) -> str | None:
        """The schema version of the file; a ledger on read-only media is read immutable."""
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
        """Before each read: a file read immutable must still be the one opened; a transaction no block
        holds (an interrupt cut its cleanup short) is ended; the busy timeout a write set to 0 is put back."""
        if self._immutable is not None:
            self._immutable.check()
        if self._held is None and self._conn.in_transaction:
            self._rollback()
        if self._quick and not self._private:
            self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            self._quick = False

    def _refuse_nested(self, *, snapshot: bool = False) -> None:
        if self._held == "snapshot" and not snapshot:
            raise write_in_read_snapshot(self.path)
        if self._held == "write":
            if snapshot:
                raise InputError(f"{self.path}: read_snapshot() inside a write transaction is refused")
            raise write_in_transaction(self.path)

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
        self._refuse_nested()
        conn, fault = self._conn, self._fault if command else None
        try:
            try:
                if self._conn.in_transaction:  # left open by an interrupted cleanup
                    self._rollback()
                self._begin_immediate()
                self._held = "write"
                if fault is not None:
                    fault.reached("after_begin")
                yield conn
                if fault is not None:
                    fault.reached("before_commit")
                self._owner.check()  # a forked child inside the parent's transaction: never its COMMIT
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

    def _begin_immediate(self) -> None:
        """`BEGIN IMMEDIATE` retried after short random waits (from a window growing from 50 µs to
        2 ms, full jitter so waiters do not retry in step) until the busy timeout has passed."""
        if not self._quick:
            self._conn.execute("PRAGMA busy_timeout = 0")
            self._quick = True
        deadline, window = time.monotonic() + self._busy_timeout, 0.00005
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                now = time.monotonic()
                if getattr(e, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY or now >= deadline:
                    raise StoreError(f"{self.path}: could not take the write lock ({e})") from e
            time.sleep(min(random.uniform(0.0, window), deadline - now))
            window = min(window * 2, 0.002)

    @contextmanager
    def transaction(self) -> Iterator[SQLiteTransaction]:
        with self._write(command=True) as conn:
            tx = SQLiteTransaction(conn, self._owner)
            yield tx
            if tx.failed is not None:
                raise StoreError(f"{tx.failed}; nothing in this transaction was committed")

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One deferred read transaction: WAL keeps its snapshot (from the first read inside)
        while other connections commit, and never blocks them."""
        self._owner.check()
        if self._held == "snapshot":
            yield
            return
        self._refuse_nested(snapshot=True)
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

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        status: str | None = None,
        category: str | None = None,
        fresh_ids: bool = False,
        expect: Sequence[tuple[str, int]] = (),
    ) -> AppendResult:
        with self.transaction() as tx:
            return tx.append(
                stream_id,
                expected_version,
                events,
                status=status,
                category=category,
                fresh_ids=fresh_ids,
                expect=expect,
            )

    # --- reads ----------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            self._ready_to_read()
            yield self._conn
        except SQLITE_FAILURES as e:
            raise translate_sqlite_error(e, self.path) from e

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._reading() as conn:
            return conn.execute(sql, params).fetchall()

    def _batches(self, sql: str, params: Sequence[Any], size: int) -> Iterator[list[Any]]:
        """A read's rows in `fetchmany` batches, one SELECT (one read snapshot), memory flat as the log grows."""
        with self._reading() as conn:
            cursor = conn.execute(sql, params)
            while True:
                self._owner.check()  # a read carried into another thread or a forked child stops there
                rows = cursor.fetchmany(size)
                if not rows:
                    return
                yield rows

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [StoredEvent(*row) for row in self._all(_STREAM, (stream_id, after_version))]

    def stream_version(self, stream_id: str) -> int:
        rows = self._all(_VERSION, (stream_id,))
        return int(rows[0][0]) if rows else 0

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        rows = self._all(f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ?", (event_id,))
        return StoredEvent(*rows[0]) if rows else None

    def select_rows(self, query: EventFilter = ALL_EVENTS) -> Iterator[list[Row]]:
        """Small batches on purpose: a row is hashed and folded while its payload is still in the CPU
        cache, and fewer rows alive at once make the garbage collector's passes cheaper."""
        where, params = filter_sql(query)
        return self._batches(f"SELECT {EVENT_COLUMNS} FROM events WHERE {where}", params, 256)

    def position_at(self, recorded_at: str) -> int:
        return int(self._all("SELECT max(seq) FROM events WHERE recorded_at <= ?", (recorded_at,))[0][0] or 0)

    def head(self) -> Head:
        rows = self._all(_HEAD)
        return _head(rows[0]) if rows else Head(0, GENESIS_HASH)

    def count_events(self) -> int:
        return int(self._all("SELECT count(*) FROM events")[0][0])

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        with self._reading() as conn:
            return _stream_heads(conn, statuses)

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        with self._write() as conn:
            heads = list(derive())
            conn.execute("DELETE FROM streams")
            conn.executemany(
                "INSERT INTO streams (stream_id, version, status, category) VALUES (?,?,?,?)",
                [(h.stream_id, h.version, h.status, h.category) for h in heads],
            )

    # --- checkpoints ----------------------------------------------------------------------

    def append_checkpoint(
        self,
        *,
        position: int,
        schema_version: int,
        fingerprint: str,
        snapshot: str,
        recorded_at: str,
        streams: Sequence[tuple[str, int, str]] = (),
    ) -> CheckpointRecord:
        with self._write() as conn:
            row = conn.execute("SELECT hash FROM events WHERE seq = ?", (position,)).fetchone()
            if row is None and position != 0:
                raise IntegrityError(f"no event at position {position} to checkpoint", seq=position)
            head_hash = row[0] if row else GENESIS_HASH
            digest = _sha256(snapshot)
            cur = conn.execute(
                "INSERT INTO checkpoints (position, head_hash, schema_version, fingerprint, snapshot, "
                "snapshot_sha256, recorded_at) VALUES (?,?,?,?,?,?,?)",
                (position, head_hash, schema_version, fingerprint, snapshot, digest, recorded_at),
            )
            checkpoint_id = int(cur.lastrowid or 0)
            conn.executemany(
                "INSERT INTO checkpoint_streams (checkpoint_id, stream_id, version, state, state_sha256) "
                "VALUES (?,?,?,?,?)",
                [(checkpoint_id, sid, v, text, _sha256(text)) for sid, v, text in streams],
            )
        return CheckpointRecord(
            checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, digest, recorded_at
        )

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        rows = self._all(f"{_SNAPSHOTS} WHERE s.checkpoint_id = ? ORDER BY s.stream_id", (checkpoint_id,))
        return [StreamSnapshot(*r) for r in rows]

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        sql = f"{_SNAPSHOTS} WHERE s.stream_id = ? ORDER BY c.position DESC, c.checkpoint_id DESC LIMIT 1"
        rows = self._all(sql, (stream_id,))
        return StreamSnapshot(*rows[0]) if rows else None

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        # One row at a time: a load stops at the first trusted checkpoint and must not read every
        # older snapshot to get there. Without a bound every row, also one whose position was edited
        # into no seq at all (its reader judges it broken).
        where, params = ("", ()) if at_or_before is None else (" WHERE position <= ?", (at_or_before,))
        sql = f"{_CHECKPOINTS}{where} ORDER BY position DESC, checkpoint_id DESC"
        for rows in self._batches(sql, params, 1):
            yield CheckpointRecord(*rows[0])

    def guard_problems(self) -> list[str]:
        with self._reading() as conn:
            return guard_problems(conn)

    # --- the handle -----------------------------------------------------------------------

    def _keep_in_child(self) -> None:
        """In a forked child: the inherited connection is never used, closed or freed there."""
        keep_for_good(self._conn)

    def close(self) -> None:
        self._owner.release()
        self._conn.close()

    def __enter__(self) -> SQLiteEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _head(row: Sequence[Any]) -> Head:
    return Head(row[0], row[1])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _stream_heads(conn: sqlite3.Connection, statuses: Iterable[str] | None) -> list[StreamHead]:
    sql, params = "SELECT stream_id, version, status, category FROM streams", list(statuses or ())
    if statuses is not None:
        sql += f" WHERE status IN ({','.join('?' * len(params))})"
    return [StreamHead(*r) for r in conn.execute(sql + " ORDER BY stream_id", params)]
