"""What only the SQLite store has, on real files: its triggers seen from sqlite3, WAL, the busy timeout.

Everything a backend must do is in the contract suite (test_store_contract.py,
test_store_chain.py, test_store_concurrency.py), which runs against SQLite too.
"""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm.store import (
    ConcurrencyError,
    DuplicateEventError,
    InputError,
    NewEvent,
    SQLiteEventStore,
    StoreError,
)
from lifecycle_fsm.store.base import event_at, select_events, verify_chain

REPO = Path(__file__).resolve().parent.parent


def new(stream: str = "s", n: int = 0, *, event_id: str | None = None, **payload: Any) -> NewEvent:
    """A small event for stream `stream`; `n` makes its id and payload unique."""
    return NewEvent(
        stream_id=stream,
        type="Happened",
        schema_version=1,
        payload=payload or {"n": n},
        event_id=event_id or f"{stream}-{n}",
        recorded_at=f"2024-01-01T00:00:{n % 60:02d}.000000Z",
        actor="tester",
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteEventStore]:
    with SQLiteEventStore(db, synchronous="NORMAL") as s:
        yield s


@pytest.fixture
def filled(store: SQLiteEventStore) -> SQLiteEventStore:
    """Five events over two streams: a0 a1 b0 a2 b1 (seq 1..5)."""
    store.append("a", 0, [new("a", 0), new("a", 1)])
    store.append("b", 0, [new("b", 0)])
    store.append("a", 2, [new("a", 2)])
    store.append("b", 1, [new("b", 1)])
    return store


@contextmanager
def plain(db: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection (not our code), autocommit, closed on exit."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def test_database_refusal_of_a_taken_id_is_a_concurrency_error(store: SQLiteEventStore) -> None:
    """An id that was promised fresh (no look-up) but is taken: SQLite refuses the row and the store
    translates its IntegrityError into ConcurrencyError (retry the command), rolling back the batch."""
    store.append("b", 0, [new("b", 0, event_id="taken")])
    with pytest.raises(ConcurrencyError, match="already taken") as info:
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")], fresh_ids=True)
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert (info.value.stream_id, info.value.expected_version, info.value.actual_version) == ("a", 0, 0)
    assert store.count_events() == 1


def test_an_append_failing_part_way_cannot_be_committed(store: SQLiteEventStore) -> None:
    """A batch whose 2nd row the database refuses has its 1st row inserted already: even when the
    caller catches the error and carries on, the transaction commits nothing (as on PostgreSQL)."""
    store.append("b", 0, [new("b", 0, event_id="taken")])

    def carry_on_after_a_failed_append() -> None:
        with store.transaction() as tx:
            tx.append("c", 0, [new("c", 0)])
            with pytest.raises(ConcurrencyError):
                tx.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")], fresh_ids=True)
            with pytest.raises(StoreError, match="rolled back"):
                tx.append("d", 0, [new("d", 0)])

    with pytest.raises(StoreError, match="failed part-way"):
        carry_on_after_a_failed_append()
    assert store.count_events() == 1 and store.stream_version("c") == 0
    assert store.append("a", 0, [new("a", 0)]).events[0].seq == 2


def test_a_taken_id_is_reported_before_a_stale_version(filled: SQLiteEventStore) -> None:
    """Only a batch's first id is looked up before its insert; when the version check then fails,
    an id taken further in the batch is still the error reported (the retry check comes first)."""
    with pytest.raises(DuplicateEventError) as info:
        filled.append("a", 7, [new("a", 9), new("a", 10, event_id="b-0")])
    assert (info.value.event_id, info.value.seq) == ("b-0", 3)
    with pytest.raises(DuplicateEventError) as info:  # right version: the insert meets it
        filled.append("a", 3, [new("a", 9), new("a", 10, event_id="b-1")])
    assert (info.value.event_id, info.value.seq) == ("b-1", 5)
    assert filled.count_events() == 5 and verify_chain(filled).ok


def test_update_and_delete_refused_by_database(filled: SQLiteEventStore, db: Path) -> None:
    """A plain sqlite3 connection cannot UPDATE or DELETE events: the triggers abort."""
    with plain(db) as conn:
        with pytest.raises(sqlite3.DatabaseError, match="UPDATE refused"):
            conn.execute("UPDATE events SET payload = '{}' WHERE seq = 2")
        with pytest.raises(sqlite3.DatabaseError, match="DELETE refused"):
            conn.execute("DELETE FROM events WHERE seq = 2")
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 5
    assert verify_chain(filled).ok


@pytest.mark.parametrize("verb", ["INSERT OR REPLACE", "REPLACE"])
def test_replace_over_existing_row_refused(filled: SQLiteEventStore, db: Path, verb: str) -> None:
    """INSERT OR REPLACE of an existing seq cannot delete the row behind the triggers' back."""
    before = event_at(filled, 2)
    with plain(db) as conn, pytest.raises(sqlite3.DatabaseError, match="REPLACE refused"):
        conn.execute(
            f"{verb} INTO events SELECT seq, stream_id, version, event_id, type, schema_version, "
            "'{\"n\":99}', recorded_at, actor, prev_hash, hash FROM events WHERE seq = 2"
        )
    assert event_at(filled, 2) == before
    assert verify_chain(filled).ok


def test_wal_mode_is_on(store: SQLiteEventStore, db: Path) -> None:
    """The file is in WAL mode, as seen by any connection."""
    store.append("a", 0, [new("a", 0)])
    with plain(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_second_writer_waits_for_the_lock(store: SQLiteEventStore, db: Path) -> None:
    """While another connection holds BEGIN IMMEDIATE briefly, an append waits and then succeeds."""
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold_lock() -> None:
        try:
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(0.3)  # hold the write lock ~0.3 s
            conn.execute("COMMIT")
            conn.close()
        except BaseException as e:  # surfaced below
            errors.append(e)
            locked.set()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    assert locked.wait(30)
    result = store.append("a", 0, [new("a", 0)])
    holder.join()
    assert not errors
    assert result.events[0].seq == 1


def test_lock_held_past_busy_timeout_is_store_error(db: Path) -> None:
    """A writer that cannot get the lock within its busy timeout gets StoreError, not a sqlite3 error."""
    with SQLiteEventStore(db, busy_timeout=0.05) as impatient, plain(db) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="write lock"):
                impatient.append("a", 0, [new("a", 0)])
        finally:
            conn.execute("ROLLBACK")
        assert impatient.count_events() == 0


def test_random_bytes_file_is_store_error(tmp_path: Path) -> None:
    """Opening a file that is not an SQLite database is a StoreError."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"definitely not sqlite\n" * 200)
    with pytest.raises(StoreError, match="not a usable ledger"):
        SQLiteEventStore(path)


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A database with tables of its own is not made a ledger: nothing is added to it."""
    path = tmp_path / "app.db"
    with plain(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreError, match="another application's database, not a ledger"):
        SQLiteEventStore(path)
    with plain(path) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["users"]


def test_an_empty_file_made_by_someone_else_becomes_a_private_ledger(tmp_path: Path) -> None:
    """A ledger file is its owner's alone (0600), also when the empty file was made with another mode."""
    path = tmp_path / "empty.db"
    path.touch(mode=0o644)
    path.chmod(0o644)
    SQLiteEventStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_store_schema_version_mismatch_is_store_error(filled: SQLiteEventStore, db: Path) -> None:
    """A file written by another store schema version is refused, not guessed at."""
    filled.close()
    with plain(db) as conn:
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'store_schema_version'")
    with pytest.raises(StoreError, match="schema version"):
        SQLiteEventStore(db)


def test_a_file_of_another_store_schema_is_refused(filled: SQLiteEventStore, db: Path) -> None:
    """Version 1 is the only store schema there is: any other (older, newer) is refused whole."""
    filled.close()
    for other in ("0", "2", "x"):
        with plain(db) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'store_schema_version'", (other,))
        with pytest.raises(StoreError, match=f"store schema version {other} is not 1"):
            SQLiteEventStore(db)


def test_the_schema_is_made_by_sqlite_utils(filled: SQLiteEventStore, db: Path) -> None:
    """Every table, index and trigger, as sqlite-utils sees them: the unique keys the guarantees rest
    on, the append-only triggers, and the auditor's filter indexes on the derived event index (none on
    `events`, whose every commit would pay for them)."""
    import sqlite_utils

    database = sqlite_utils.Database(db)
    try:
        assert set(database.table_names()) == {
            "events",
            "event_index",
            "streams",
            "checkpoints",
            "checkpoint_streams",
            "meta",
        }
        events = database["events"]
        unique = {tuple(i.columns) for i in events.indexes if i.unique}
        assert unique == {("stream_id", "version"), ("event_id",)}
        assert not [i for i in events.indexes if not i.unique]
        index = database["event_index"]
        assert index.pks == ["seq"]
        assert {tuple(i.columns) for i in index.indexes} == {("type",), ("actor",), ("recorded_at",)}
        assert {t.name for t in events.triggers} == {
            "events_refuse_update",
            "events_refuse_delete",
            "events_refuse_replace",
        }
        assert events.pks == ["seq"] and database["meta"].get("store_schema_version")["value"] == "1"
    finally:
        database.close()


def test_a_plain_insert_of_version_0_is_refused(filled: SQLiteEventStore, db: Path) -> None:
    """The insert trigger refuses a version below 1 (a CHECK constraint would ABORT)."""
    with plain(db) as conn, pytest.raises(sqlite3.DatabaseError, match="version must be >= 1"):
        conn.execute("INSERT INTO events VALUES (6, 'z', 0, 'z-0', 'T', 1, '{}', 'r', 'a', 'p', 'h')")
    assert filled.count_events() == 5


@pytest.mark.parametrize("clash", ["seq", "event_id", "stream_version"])
def test_replace_clashing_on_any_unique_key_removes_nothing(filled: SQLiteEventStore, db: Path, clash: str) -> None:
    """INSERT OR REPLACE of a new row that clashes on one key only (seq, event id, or stream and
    version), from a plain connection with recursive_triggers off: refused, every row still there."""
    before = list(select_events(filled))
    row: dict[str, Any] = {"seq": 6, "stream_id": "z", "version": 1, "event_id": "z-0"}
    taken: dict[str, dict[str, Any]] = {
        "seq": {"seq": 3},
        "event_id": {"event_id": "a-1"},
        "stream_version": {"stream_id": "a", "version": 2},
    }
    row.update(taken[clash])
    with plain(db) as conn:
        assert conn.execute("PRAGMA recursive_triggers").fetchone()[0] == 0
        with pytest.raises(sqlite3.DatabaseError, match="REPLACE refused"):
            conn.execute(
                "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?, 'T', 1, '{}', 'r', 'a', 'p', 'h')",
                (row["seq"], row["stream_id"], row["version"], row["event_id"]),
            )
    assert list(select_events(filled)) == before and verify_chain(filled).ok


def test_bad_synchronous_mode_is_input_error(db: Path) -> None:
    """An unknown synchronous mode is refused before the file is touched."""
    with pytest.raises(InputError):
        SQLiteEventStore(db, synchronous="SOMETIMES")
    assert not db.exists()


def test_an_insert_into_events_can_only_fail_not_abort(store: SQLiteEventStore, db: Path) -> None:
    """The store inserts with `INSERT OR FAIL` and the insert trigger raises FAIL, never ABORT: one ABORT
    would make every row's INSERT run under a statement journal (store/sqlite_schema.py says why)."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    store.append("a", 0, [new("a", 0), new("a", 1)])
    store._conn.set_trace_callback(None)
    inserts = [s for s in statements if "INTO events " in s]
    assert inserts and all(s.startswith("INSERT OR FAIL INTO events ") for s in inserts)
    with plain(db) as conn:
        triggers = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND sql LIKE '%BEFORE INSERT%'")
        bodies = [r[0] for r in triggers]
    assert bodies and all("RAISE(FAIL" in b and "ABORT" not in b for b in bodies)


def test_writes_wait_in_our_own_steps_and_reads_get_the_full_busy_timeout_back(db: Path) -> None:
    """A write leaves the busy timeout at 0 (the lock is waited for in our own steps, up to the
    store's busy timeout); any read first puts the store's busy timeout back, so a read that meets
    a lock still waits."""

    def busy_timeout(store: SQLiteEventStore) -> int:
        return int(store._conn.execute("PRAGMA busy_timeout").fetchone()[0])  # type: ignore[attr-defined]

    with SQLiteEventStore(db, busy_timeout=12.5) as store:
        store.append("a", 0, [new("a", 0)])
        assert busy_timeout(store) == 0
        assert store.stream_version("a") == 1 and busy_timeout(store) == 12500
        store.append("a", 1, [new("a", 1)])
        assert [e.seq for e in select_events(store)] == [1, 2] and busy_timeout(store) == 12500
    with SQLiteEventStore(db, busy_timeout=0.05) as impatient, plain(db) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="write lock"):
                impatient.append("a", 2, [new("a", 2)])
        finally:
            conn.execute("ROLLBACK")
        assert impatient.count_events() == 2 and busy_timeout(impatient) == 50
        assert impatient.append("a", 2, [new("a", 2)]).events[0].seq == 3


def test_no_new_ledger_over_an_orphaned_wal(tmp_path: Path) -> None:
    """The ledger file is gone but its -wal holds committed events: a write command must not start
    a fresh ledger there (SQLite would discard the WAL, and those events with it)."""
    db = tmp_path / "l.db"
    store = SQLiteEventStore(db, synchronous="NORMAL")
    holder = sqlite3.connect(db)  # keeps the WAL from being folded into the file on close
    holder.execute("SELECT count(*) FROM events").fetchone()
    store.append("a", 0, [new("a", 0)])
    wal = (tmp_path / "l.db-wal").read_bytes()
    store.close()
    holder.close()
    db.unlink()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"l.db{suffix}").unlink(missing_ok=True)
    (tmp_path / "l.db-wal").write_bytes(wal)
    with pytest.raises(StoreError, match=r"l\.db-wal holds"):
        SQLiteEventStore(db)
    assert not db.exists() and (tmp_path / "l.db-wal").read_bytes() == wal
    (tmp_path / "l.db-wal").write_bytes(b"")  # an empty WAL holds nothing: a new ledger is fine
    SQLiteEventStore(db).close()


def test_a_path_the_file_system_refuses_is_a_store_error_not_a_bare_os_error(tmp_path: Path) -> None:
    """Looking for an orphaned `-wal` caught only FileNotFoundError: a folder that is a file
    (`/etc/passwd/x.db`) was a bare NotADirectoryError, and a name whose `-wal` is too long (a
    252-255 character file name) a bare `OSError: [Errno 36] File name too long` with the traceback
    (`Ledger.open`, the CLI's writes)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for target in (afile / "ledger.db", tmp_path / ("l" * 253), tmp_path / ("l" * 300)):
        with pytest.raises(StoreError, match="cannot create the ledger file"):
            SQLiteEventStore(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_head_time_edited_into_a_blob_is_no_time_to_stamp_after(filled: SQLiteEventStore, db: Path) -> None:
    """A column of the head edited to another type by hand: the append stamps the given time (no TypeError);
    the edit itself is `verify`'s finding."""
    head = filled.head().seq
    with plain(db) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("UPDATE events SET recorded_at = CAST(recorded_at AS BLOB) WHERE seq = ?", (head,))
    (stored,) = filled.append("blob", 0, [new("blob", 0)]).events
    assert stored.recorded_at == new("blob", 0).recorded_at
    assert verify_chain(filled).bad_seq == head
