"""The PostgreSQL event store: the same append-only, hash-chained log for many machines.

Why it is built this way:
- Appends are serialised by a transaction-level advisory lock (one key per ledger
  schema) taken before `seq` is assigned, so `seq` is dense and in commit order: a
  writer cannot take the lock until the previous one has committed and become
  visible, so a reader polling `seq > last` never skips an event that commits late
  (a bare sequence does: LIBRARY_NOTES measured 32% skipped). The chain needs a total
  order anyway. An advisory lock, not `LOCK TABLE … EXCLUSIVE`, because a role with
  only SELECT and INSERT may not take that table lock.
- Read committed, never repeatable read: every statement after the lock sees the
  newest committed head (under repeatable read the snapshot predates the lock).
- One round trip per append, the lock held only while the server runs it:
  `store.append` (what a one-append command calls) sends the lock and one INSERT that
  reads the head itself, computes `seq` and the chain hash in SQL, upserts the stream
  index and notifies followers (data-modifying CTEs, `store/postgres_append.py`), as
  prepared statements in libpq's pipeline mode, committed by the one Sync that ends
  them (`store/postgres_pipeline.py`: no statement text to parse, values sent as text
  parameters; without pipeline mode, an older libpq, the same statements go as one
  simple-query message). It lands only if the stream version (and the `expect=`
  versions of streams the command read but does not write) still hold; if not,
  nothing was written and the slow path below says which stream moved. The client's
  hashes (chained after the last head it saw) are stored when that head is still the
  head; otherwise the server hashes, so another writer's append costs nothing extra (a
  guess that had to be retried went stale at once with 8 writers, and the retry held
  the lock across a round trip).
- Transactions (`store.transaction()`, several appends, fault hooks) chain rows in
  Python (`store.chain.chain_rows`) against a guessed head checked by their first
  INSERT, re-read under the lock when stale; they pay one more trip (the COMMIT).
- Followers: every appending commit notifies the ledger's channel (delivered at
  COMMIT, never for a rollback or a refused append); `wait_for_new` blocks on it,
  polling stays the truth.
- Either way an event hashes the same here and in SQLite (the server's hash is re-checked
  by the client); `payload` and `recorded_at` are stored as the exact text that was hashed.
- A connection the server dropped (restart, failover, an ended session) fails the call that met
  it, once; the next call opens a new session before it starts, never inside a transaction
  (`PgSession.recover`, checked with two attribute reads per call: a supervisor on many machines
  keeps its Ledger across a failover).
- `lock_timeout` (from `busy_timeout`) bounds the wait for the lock and
  `idle_in_transaction_session_timeout` ends a writer that stalls holding it; both
  surface as `StoreError` (README says what a user sees).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from lifecycle_fsm.store.base import AppendResult
from lifecycle_fsm.store.chain import GENESIS_HASH, verify_rows
from lifecycle_fsm.store.errors import InputError, IntegrityError, write_in_read_snapshot, write_in_transaction
from lifecycle_fsm.store.faults import fault_from_env
from lifecycle_fsm.store.postgres_pipeline import COMMIT_UNKNOWN, NOTHING_COMMITTED
from lifecycle_fsm.store.postgres_schema import EVENT_COLUMNS, PG_GUARD_SOURCE, PG_GUARDS, PgSession, filter_sql
from lifecycle_fsm.store.postgres_transaction import VERSION_OF, PostgresTransaction
from lifecycle_fsm.store.records import (
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)
from lifecycle_fsm.store.threads import one_thread

__all__ = ["PostgresEventStore", "PostgresTransaction"]


_SNAPSHOT_COLUMNS = (
    "c.checkpoint_id, c.position, c.head_hash, c.schema_version, c.fingerprint, "
    "s.stream_id, s.version, s.state, s.state_sha256"
)
_NO_UPPER = 1 << 62
_ONE_TRIP_ROWS = 1000  # store.append's one-round-trip path: one INSERT statement (see postgres_transaction)


def _unqualified(definition: str) -> str:
    """A trigger's definition with its table's schema left out (the ledger's schema varies)."""
    return re.sub(r" ON [^ ]+\.events ", " ON events ", definition)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@one_thread
class PostgresEventStore:
    """An `EventStore` in a PostgreSQL schema (see the module docstring for why)."""

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        idle_timeout: float = 60.0,
        create: bool = True,
    ) -> None:
        self._fault = fault_from_env()
        self.session = PgSession(url, synchronous=synchronous, busy_timeout=busy_timeout, idle_timeout=idle_timeout)
        try:
            self.session.ensure_schema(create=create)
        except BaseException:
            self.session.close()
            raise
        self.where = self.session.where
        self._owner = self.session.owner
        self.last_head = Head(0, GENESIS_HASH)  # a transaction's first guess, checked by its insert
        self._reading = False  # inside `read_snapshot()`

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.session.mapped("read failed"):
            return self.session.query(sql, params).fetchall()

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self.session.mapped("read failed"):
            return self.session.query(sql, params).fetchone()

    @contextmanager
    def transaction(self) -> Iterator[PostgresTransaction]:
        # Entered (not only created) by the owner: another thread's `with` would run the exit,
        # and its rollback, on the owner's connection (`one_thread` checks the call alone).
        self._owner.check()
        session = self.session
        self._refuse_nested_write()
        with session.mapped("cannot start a write transaction"):
            session.ready()  # before the transaction: never reconnect inside one
        tx = PostgresTransaction(self)
        session.held = True  # its BEGIN goes with its first statement, inside the block
        try:
            yield tx
            tx.finish()
            if self._fault is not None:
                self._fault.reached("before_commit")
            if tx.started:
                with session.mapped("commit failed", lost=COMMIT_UNKNOWN):
                    session.conn.execute(f"{session.notify_sql}; COMMIT" if tx.head is not None else "COMMIT")
        except BaseException:
            self._rollback()
            raise
        finally:
            session.held = False
        if tx.head is not None:
            self.last_head = tx.head
        if self._fault is not None:
            self._fault.reached("after_commit")

    def _refuse_nested_write(self) -> None:
        """A write through the store inside its own open read snapshot or transaction is refused (it
        would run inside that transaction: not committed by its own Sync, and lost with it)."""
        if self._reading:
            raise write_in_read_snapshot(self.where)
        if self.session.held:
            raise write_in_transaction(self.where)

    def _rollback(self) -> None:
        if self._owner.forked:  # a forked child left inside the parent's transaction: nothing is sent
            return
        conn = self.session.conn
        if conn.closed or conn.pgconn.transaction_status == TransactionStatus.IDLE:
            return
        with contextlib.suppress(psycopg.Error):  # the connection is gone: the server rolled back already
            conn.execute("ROLLBACK")

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One REPEATABLE READ, READ ONLY transaction: every statement inside sees the snapshot
        its first one took. The pages keep coming one statement at a time, so the session is
        idle in it only while the caller works on a page (`idle_timeout` ends a longer pause)."""
        self._owner.check()  # entered by the owner: the exit's rollback runs on its connection
        if self._reading:
            yield
            return
        session = self.session
        if session.held:
            raise InputError(f"{self.where}: read_snapshot() inside a write transaction is refused")
        with session.mapped("cannot start a read snapshot"):
            session.ready()
        session.held = True
        try:  # BEGIN inside: an interrupt once it is answered still ends it
            with session.mapped("cannot start a read snapshot"):
                session.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._reading = True
            yield
        finally:
            self._reading = session.held = False
            self._rollback()

    @contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        """A maintenance transaction under the write lock (index rebuild, checkpoints)."""
        self._refuse_nested_write()
        session = self.session
        with session.mapped(what):
            session.ready()
        session.held = True
        try:  # BEGIN and the lock inside: an interrupt once they are answered still rolls back
            with session.mapped(what, lost=NOTHING_COMMITTED):
                session.conn.execute(f"BEGIN; {session.lock_sql}")
                yield
            with session.mapped(what, lost=COMMIT_UNKNOWN):
                session.conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        finally:
            session.held = False

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
        session = self.session
        if self._reading or session.held:
            self._refuse_nested_write()
        pg = session.conn.pgconn
        if pg.transaction_status or pg.pipeline_status:  # `session.ready()`, inlined on the hot path
            with session.mapped("write transaction failed"):
                session.recover()
        if events and self._fault is None and len(events) <= _ONE_TRIP_ROWS:
            # One round trip, the server chaining the rows to the head it finds under the
            # lock. A fault hook needs the slow path's separate COMMIT to strike before it.
            tx = PostgresTransaction(self)
            for other, version in expect:  # checked by the chained insert, in the same round trip
                tx.expect_version(other, version)
            try:
                done = tx.append_and_commit(stream_id, expected_version, events, status=status, category=category,
                                            fresh_ids=fresh_ids)  # fmt: skip
            except BaseException:
                self._rollback()
                raise
            if done is not None:
                if tx.head is not None:
                    self.last_head = tx.head
                return done
            # A version moved (nothing was written): the slow path says which, under the lock.
        with self.transaction() as tx:
            for other, version in expect:
                tx.expect_version(other, version)
            return tx.append(stream_id, expected_version, events, status=status, category=category, fresh_ids=fresh_ids)

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        rows = self._rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = %s AND version > %s ORDER BY version",
            (stream_id, after_version),
        )
        return [StoredEvent(*row) for row in rows]

    def stream_version(self, stream_id: str) -> int:
        row = self._one(f"SELECT {VERSION_OF}", (stream_id,))
        return int(row[0]) if row else 0

    def _pages(self, columns: str, after: int, to: int | None, size: int) -> Iterator[list[tuple[Any, ...]]]:
        """The rows after `after` (up to `to`) in pages of at most `size` consecutive seqs.

        Pages in autocommit, no transaction held open while the caller works (an idle
        transaction would hit idle_in_transaction_session_timeout). `seq` is dense and in
        commit order, so consecutive pages form one prefix of the log. A page is a range of
        seqs, not `seq > x ORDER BY seq LIMIT n`: with statistics the server has not caught
        up with (a freshly loaded table) the planner answered that LIMIT by sorting every row
        after `x`, on disk, for every page — a replay quadratic in the log's length (measured:
        55 ms a page of 5,000 on a 50k-event table). A range bounds each page's work whatever
        the plan. A range that holds fewer rows than seqs ends at a gap (a damaged log, which
        the reader's walk reports) or at the head: the next stored seq after the last row read
        (a row committed meanwhile, or the far side of a gap), if any, goes on.
        """
        upper = _NO_UPPER if to is None else to
        last = after
        while last < upper:
            end = min(last + size, upper)
            rows = self._rows(f"SELECT {columns} FROM events WHERE seq > %s AND seq <= %s ORDER BY seq", (last, end))
            if rows:
                yield rows
            if len(rows) < end - last:
                # From the last row read, not from `end`: rows committed while the caller held this
                # page (after it, up to `end`) are the log's next rows, not a gap.
                seen = rows[-1][0] if rows else last
                found = self._one("SELECT min(seq) FROM events WHERE seq > %s AND seq <= %s", (seen, upper))
                if found is None or found[0] is None:
                    return
                end = int(found[0]) - 1
            last = end

    def select_events(self, *, after: int = 0, to: int | None = None) -> Iterator[StoredEvent]:
        for rows in self._pages(EVENT_COLUMNS, after, to, 2000):
            for row in rows:
                yield StoredEvent(*row)

    def select_fold_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """Batches of `(seq, stream_id, version, type, schema_version, payload)` rows in order."""
        yield from self._pages("seq, stream_id, version, type, schema_version, payload", after, to, 4096)

    def select_row_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """Whole rows (`StoredEvent` field order) in pages of seqs, for the checked folds."""
        yield from self._pages(EVENT_COLUMNS, after, to, 4096)

    def select_matching(self, query: EventFilter) -> Iterator[StoredEvent]:
        # Keyset pages by seq (LIMIT, not `_pages`' ranges: matches may be sparse); no transaction
        # stays open while the caller reads.
        where, params = filter_sql(query)
        last, left = query.after, query.limit
        while left is None or left > 0:
            size = 2000 if left is None else min(2000, left)
            sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE {where} AND seq > %s ORDER BY seq LIMIT {size}"
            rows = self._rows(sql, (*params, last))
            yield from (StoredEvent(*row) for row in rows)
            if len(rows) < size:
                return
            last = rows[-1][0]
            left = None if left is None else left - len(rows)

    def position_at(self, recorded_at: str) -> int:
        row = self._one("SELECT coalesce(max(seq), 0) FROM events WHERE recorded_at <= %s", (recorded_at,))
        return int(row[0]) if row else 0

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        row = self._one(f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = %s", (event_id,))
        return None if row is None else StoredEvent(*row)

    def event_at(self, seq: int) -> StoredEvent | None:
        row = self._one(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq = %s", (seq,))
        return None if row is None else StoredEvent(*row)

    def head(self) -> Head:
        row = self._one("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        head = Head(row[0], row[1]) if row else Head(0, GENESIS_HASH)
        self.last_head = head  # a committed row: a good guess for the next append
        return head

    def hash_at(self, seq: int) -> str | None:
        if seq == 0:
            return GENESIS_HASH
        row = self._one("SELECT hash FROM events WHERE seq = %s", (seq,))
        return None if row is None else str(row[0])

    def count_events(self) -> int:
        row = self._one("SELECT count(*) FROM events")
        return int(row[0]) if row else 0

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        if statuses is None:
            rows = self._rows("SELECT stream_id, version, status, category FROM streams ORDER BY stream_id")
        else:
            rows = self._rows(
                "SELECT stream_id, version, status, category FROM streams WHERE status = ANY(%s::text[]) "
                "ORDER BY stream_id",
                (list(statuses),),
            )
        return [StreamHead(*row) for row in rows]

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        with self._locked("cannot rebuild the stream index"):
            heads = list(derive())
            conn = self.session.conn
            conn.execute("DELETE FROM streams")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO streams (stream_id, version, status, category) VALUES (%s, %s, %s, %s)",
                    [(h.stream_id, h.version, h.status, h.category) for h in heads],
                )

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
        digest = hashlib.sha256(snapshot.encode()).hexdigest()
        with self._locked("cannot store the checkpoint"):
            conn = self.session.conn
            row = conn.execute("SELECT hash FROM events WHERE seq = %s", (position,)).fetchone()
            if row is None and position != 0:
                raise IntegrityError(f"no event at position {position} to checkpoint", seq=position)
            head_hash = row[0] if row else GENESIS_HASH
            made = conn.execute(
                "INSERT INTO checkpoints (position, head_hash, schema_version, fingerprint, snapshot, "
                "snapshot_sha256, recorded_at) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING checkpoint_id",
                (position, head_hash, schema_version, fingerprint, snapshot, digest, recorded_at),
            ).fetchone()
            assert made is not None
            checkpoint_id = int(made[0])
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO checkpoint_streams (checkpoint_id, stream_id, version, state, state_sha256) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    [(checkpoint_id, sid, v, text, _sha256(text)) for sid, v, text in streams],
                )
        return CheckpointRecord(
            checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, digest, recorded_at
        )

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        rows = self._rows(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM checkpoint_streams s JOIN checkpoints c "
            "ON c.checkpoint_id = s.checkpoint_id WHERE s.checkpoint_id = %s ORDER BY s.stream_id",
            (checkpoint_id,),
        )
        return [StreamSnapshot(*row) for row in rows]

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        row = self._one(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM checkpoint_streams s JOIN checkpoints c "
            "ON c.checkpoint_id = s.checkpoint_id WHERE s.stream_id = %s "
            "ORDER BY c.position DESC, c.checkpoint_id DESC LIMIT 1",
            (stream_id,),
        )
        return None if row is None else StreamSnapshot(*row)

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        # Two at a time, newest first: a load stops at the first trusted one and must not
        # read every older snapshot to get there.
        key: tuple[int, int] = (_NO_UPPER if at_or_before is None else at_or_before, _NO_UPPER)
        while True:
            rows = self._rows(
                "SELECT checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, snapshot_sha256, "
                "recorded_at FROM checkpoints WHERE position <= %s AND (position, checkpoint_id) < (%s, %s) "
                "ORDER BY position DESC, checkpoint_id DESC LIMIT 2",
                (key[0], key[0], key[1]),
            )
            for row in rows:
                yield CheckpointRecord(*row)
            if len(rows) < 2:
                return
            key = (rows[-1][1], rows[-1][0])

    def guard_problems(self) -> list[str]:
        """Each append-only trigger on `events` that is missing, not enabled for every session
        (`DISABLE`, or `ENABLE REPLICA`: it then fires only for replication), or not exactly as
        `postgres_schema.DDL` made it (a `WHEN`, another timing, another function or body)."""
        rows = self._rows(
            "SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid), p.prosrc FROM pg_trigger t "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'events'::regclass AND NOT t.tgisinternal"
        )
        found = {name: (enabled, _unqualified(definition), " ".join(source.split())) for name, enabled, definition,
                 source in rows}  # fmt: skip
        problems = []
        for name, definition in PG_GUARDS.items():
            if name not in found:
                problems.append(f"trigger {name} is missing")
            elif found[name][0] not in ("O", "A"):
                problems.append(f"trigger {name} is disabled")
            elif found[name][1] != definition or found[name][2] != PG_GUARD_SOURCE:
                problems.append(f"trigger {name} was altered")
        return problems

    def verify_chain(self) -> ChainReport:
        return verify_rows(self.select_row_batches(), count=self.count_events, head=self.head)

    def wait_for_new(self, after: int, timeout: float) -> bool:
        """Block until an event past `after` is committed (True) or `timeout` seconds pass (False).

        Every commit that appends sends `NOTIFY` on this ledger's channel; a follower's
        listening connection (opened on first use) wakes on it instead of polling. The
        head is checked after LISTEN and after each wake-up, so a commit that raced the
        LISTEN, or a notification lost while disconnected, only costs the timeout's
        worth of polling: callers keep polling by seq, this just makes the wait short.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        listener = self.session.listener()
        with self.session.mapped("cannot wait for new events"):
            while True:
                row = listener.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
                if row is not None and row[0] > after:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for _ in listener.notifies(timeout=left, stop_after=1):
                    pass

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> PostgresEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
