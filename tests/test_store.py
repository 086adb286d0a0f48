"""The SQLite event store contract, on real files: appends, reads, concurrency, immutability, the chain."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from store import (
    GENESIS_HASH,
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    Head,
    InputError,
    NewEvent,
    SQLiteEventStore,
    StoreError,
    canonical_json,
    event_hash,
)
from store.sqlite import STORE_SCHEMA_VERSION

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


# --- appends and reads ------------------------------------------------------------------


def test_empty_store_reads() -> None:
    """A fresh store has no events, version 0 everywhere and the genesis head."""
    with SQLiteEventStore(":memory:") as s:
        assert s.head() == Head(0, GENESIS_HASH)
        assert s.stream_version("x") == 0
        assert s.read_stream("x") == []
        assert list(s.select_events()) == []
        assert s.event_at(1) is None
        assert s.event_by_id("nope") is None
        assert s.count_events() == 0


def test_append_assigns_seq_version_and_chain(store: SQLiteEventStore) -> None:
    """Appends get consecutive seqs, per-stream versions and hashes linked to the previous event."""
    first = store.append("a", 0, [new("a", 0), new("a", 1)])
    second = store.append("b", 0, [new("b", 0)])
    events = [*first.events, *second.events]
    assert [(e.seq, e.stream_id, e.version) for e in events] == [(1, "a", 1), (2, "a", 2), (3, "b", 1)]
    assert not first.duplicate and not second.duplicate
    prev = GENESIS_HASH
    for e in events:
        assert e.prev_hash == prev
        fields = {k: getattr(e, k) for k in ("seq", "stream_id", "version", "event_id", "type", "schema_version")}
        assert e.hash == event_hash(
            prev_hash=prev, payload=e.payload, recorded_at=e.recorded_at, actor=e.actor, **fields
        )
        prev = e.hash
    assert events[0].payload == canonical_json({"n": 0})


def test_reads_return_what_was_stored(filled: SQLiteEventStore) -> None:
    """read_stream, stream_version, head, event_at and event_by_id agree with select_events."""
    everything = list(filled.select_events())
    assert [e.seq for e in everything] == [1, 2, 3, 4, 5]
    assert [e.event_id for e in filled.read_stream("a")] == ["a-0", "a-1", "a-2"]
    assert [e.version for e in filled.read_stream("b")] == [1, 2]
    assert filled.stream_version("a") == 3
    assert filled.stream_version("b") == 2
    assert filled.stream_version("c") == 0
    assert filled.head() == Head(5, everything[-1].hash)
    assert filled.event_at(3) == everything[2]
    assert filled.event_at(6) is None
    assert filled.event_by_id("b-1") == everything[4]
    assert filled.count_events() == 5


def test_select_events_bounds(filled: SQLiteEventStore) -> None:
    """select_events yields after < seq <= to, in order."""
    assert [e.seq for e in filled.select_events(after=2)] == [3, 4, 5]
    assert [e.seq for e in filled.select_events(to=2)] == [1, 2]
    assert [e.seq for e in filled.select_events(after=1, to=4)] == [2, 3, 4]
    assert list(filled.select_events(after=5)) == []


def test_select_events_streams_a_large_log(store: SQLiteEventStore) -> None:
    """5000 events appended in 50 batches come back in seq order, each once, with per-stream versions."""
    for batch in range(50):
        stream = "even" if batch % 2 == 0 else "odd"
        base = store.stream_version(stream)
        store.append(stream, base, [new(stream, base + i) for i in range(100)])
    events = store.select_events()
    assert iter(events) is events  # a generator, not a list built up front
    count, last_seq, versions = 0, 0, {"even": 0, "odd": 0}
    for e in events:
        count += 1
        assert e.seq == last_seq + 1
        assert e.version == versions[e.stream_id] + 1
        last_seq, versions[e.stream_id] = e.seq, e.version
    assert count == 5000
    assert versions == {"even": 2500, "odd": 2500}
    assert store.verify_chain().ok


def test_transaction_spans_streams_and_rolls_back(store: SQLiteEventStore) -> None:
    """Everything appended inside one transaction lands together or not at all."""
    with store.transaction() as tx:
        tx.append("a", 0, [new("a", 0)])
        tx.append("b", 0, [new("b", 0)])
        assert tx.stream_version("a") == 1
    assert store.count_events() == 2

    def abandon() -> None:
        with store.transaction() as tx:
            tx.append("a", 1, [new("a", 1)])
            raise RuntimeError("abandon")

    with pytest.raises(RuntimeError):
        abandon()
    assert store.count_events() == 2
    assert store.stream_version("a") == 1


# --- atomic batches and input ---------------------------------------------------------------


def test_batch_with_unencodable_second_event_leaves_nothing(store: SQLiteEventStore) -> None:
    """A batch whose 2nd event has a NaN payload is refused whole: no rows, head unchanged."""
    batch = [new("a", 0), new("a", 1, x=float("nan")), new("a", 2)]
    with pytest.raises(InputError, match="non-finite"):
        store.append("a", 0, batch)
    assert store.count_events() == 0
    assert store.stream_version("a") == 0
    assert store.head() == Head(0, GENESIS_HASH)
    assert store.streams() == []


def test_batch_failing_in_the_database_leaves_nothing(store: SQLiteEventStore) -> None:
    """A batch whose 2nd row clashes in SQLite (a taken event id) rolls back its 1st row too."""
    store.append("b", 0, [new("b", 0, event_id="taken")])
    with pytest.raises(ConflictError):
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")])
    assert store.count_events() == 1
    assert store.stream_version("a") == 0


def test_database_refusal_of_a_taken_id_is_a_concurrency_error(store: SQLiteEventStore) -> None:
    """An id that was promised fresh (no look-up) but is taken: SQLite refuses the row and the store
    translates its IntegrityError into ConcurrencyError (retry the command), rolling back the batch."""
    store.append("b", 0, [new("b", 0, event_id="taken")])
    with pytest.raises(ConcurrencyError, match="already taken") as info:
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")], fresh_ids=True)
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert (info.value.stream_id, info.value.expected_version, info.value.actual_version) == ("a", 0, 0)
    assert store.count_events() == 1


def test_taken_event_id_later_in_a_batch_is_a_duplicate(store: SQLiteEventStore) -> None:
    """An event id reused by a batch's 2nd event is DuplicateEventError (not a retryable concurrency conflict)."""
    store.append("b", 0, [new("b", 0, event_id="taken")])
    with pytest.raises(DuplicateEventError) as info:
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")])
    assert (info.value.event_id, info.value.seq) == ("taken", 1)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_float_is_input_error(store: SQLiteEventStore, bad: float) -> None:
    """A non-finite number anywhere in a payload is an InputError (JSON cannot carry it)."""
    with pytest.raises(InputError):
        store.append("a", 0, [new("a", 0, nested={"list": [1.0, bad]})])
    assert store.count_events() == 0


def test_unserialisable_payload_is_input_error(store: SQLiteEventStore) -> None:
    """A payload JSON cannot carry (a set, bytes) is refused before anything is written."""
    with pytest.raises(InputError, match="not JSON-serialisable"):
        store.append("a", 0, [new("a", 0, tags={"x", "y"})])
    assert store.count_events() == 0


def test_event_of_another_stream_is_input_error(store: SQLiteEventStore) -> None:
    """Every event of an append must belong to the stream being appended to."""
    with pytest.raises(InputError):
        store.append("a", 0, [new("a", 0), new("b", 0)])
    assert store.count_events() == 0


# --- expected versions ----------------------------------------------------------------------


@pytest.mark.parametrize("expected", [0, 2, 7])
def test_wrong_expected_version(store: SQLiteEventStore, expected: int) -> None:
    """Appending at a version other than the stream's is a ConcurrencyError with structured fields."""
    store.append("a", 0, [new("a", 0)])
    with pytest.raises(ConcurrencyError) as info:
        store.append("a", expected, [new("a", 1)])
    err = info.value
    assert (err.stream_id, err.expected_version, err.actual_version) == ("a", expected, 1)
    assert isinstance(err, ConflictError)
    assert store.count_events() == 1


_RACER = """
import json, pathlib, sys, time
from store import ConcurrencyError, NewEvent, SQLiteEventStore
db, me, sync = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
store = SQLiteEventStore(db, synchronous="NORMAL")
seen = store.stream_version("race")
(sync / me).touch()
deadline = time.monotonic() + 60
while len(list(sync.iterdir())) < 2:
    if time.monotonic() > deadline:
        sys.exit("the other racer never arrived")
    time.sleep(0.002)
event = NewEvent("race", "Happened", 1, {"who": me}, "id-" + me, "2024-01-01T00:00:00Z", me)
try:
    result = store.append("race", seen, [event])
    print(json.dumps({"won": True, "seen": seen, "seq": result.events[0].seq}))
except ConcurrencyError as e:
    print(json.dumps({"won": False, "seen": seen, "expected": e.expected_version, "actual": e.actual_version}))
"""


def test_two_processes_race_for_one_version(db: Path, tmp_path: Path) -> None:
    """Two real processes both read version 0 and append at it: exactly one wins, one row lands."""
    SQLiteEventStore(db).close()
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(db), me, str(sync)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for me in ("p1", "p2")
    ]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outcomes.append(json.loads(out))
    assert [o["seen"] for o in outcomes] == [0, 0]
    winners = [o for o in outcomes if o["won"]]
    losers = [o for o in outcomes if not o["won"]]
    assert len(winners) == 1 and len(losers) == 1
    assert winners[0]["seq"] == 1
    assert (losers[0]["expected"], losers[0]["actual"]) == (0, 1)
    with plain(db) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1


# --- idempotency ----------------------------------------------------------------------------


def test_same_event_id_same_content_is_a_noop(store: SQLiteEventStore) -> None:
    """Retrying an identical append returns the original position, flagged duplicate, and writes nothing."""
    first = store.append("a", 0, [new("a", 0, event_id="once")])
    store.append("a", 1, [new("a", 1)])  # the stream moved on; the retry still names version 0
    retry = store.append("a", 0, [new("a", 0, event_id="once")])
    assert retry.duplicate
    assert retry.events == first.events
    assert retry.events[0].seq == 1
    assert store.count_events() == 2


def test_same_event_id_different_content_is_refused(store: SQLiteEventStore) -> None:
    """Reusing an event id for a different payload or stream is a DuplicateEventError naming the seq."""
    store.append("a", 0, [new("a", 0, event_id="once")])
    with pytest.raises(DuplicateEventError) as info:
        store.append("a", 1, [new("a", 0, event_id="once", other=1)])
    assert (info.value.event_id, info.value.seq) == ("once", 1)
    with pytest.raises(DuplicateEventError):
        store.append("b", 0, [new("b", 0, event_id="once")])
    assert store.count_events() == 1


# --- the database refuses to rewrite history -------------------------------------------------


def test_update_and_delete_refused_by_database(filled: SQLiteEventStore, db: Path) -> None:
    """A plain sqlite3 connection cannot UPDATE or DELETE events: the triggers abort."""
    with plain(db) as conn:
        with pytest.raises(sqlite3.DatabaseError, match="UPDATE refused"):
            conn.execute("UPDATE events SET payload = '{}' WHERE seq = 2")
        with pytest.raises(sqlite3.DatabaseError, match="DELETE refused"):
            conn.execute("DELETE FROM events WHERE seq = 2")
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 5
    assert filled.verify_chain().ok


@pytest.mark.parametrize("verb", ["INSERT OR REPLACE", "REPLACE"])
def test_replace_over_existing_row_refused(filled: SQLiteEventStore, db: Path, verb: str) -> None:
    """INSERT OR REPLACE of an existing seq cannot delete the row behind the triggers' back."""
    before = filled.event_at(2)
    with plain(db) as conn, pytest.raises(sqlite3.DatabaseError, match="REPLACE refused"):
        conn.execute(
            f"{verb} INTO events SELECT seq, stream_id, version, event_id, type, schema_version, "
            "'{\"n\":99}', recorded_at, actor, prev_hash, hash FROM events WHERE seq = 2"
        )
    assert filled.event_at(2) == before
    assert filled.verify_chain().ok


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


# --- the hash chain -----------------------------------------------------------------------------


def test_verify_chain_ok_on_good_log(filled: SQLiteEventStore) -> None:
    """An untouched log verifies, with its count and head."""
    report = filled.verify_chain()
    assert report.ok
    assert report.events == 5
    assert report.head == filled.head()
    assert report.bad_seq is None


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("payload", '{"n":666}'),
        ("actor", "mallory"),
        ("recorded_at", "2030-01-01T00:00:00.000000Z"),
        ("type", "Forged"),
        ("event_id", "forged-id"),
        ("schema_version", 9),
    ],
)
def test_edited_column_breaks_chain_at_that_seq(filled: SQLiteEventStore, db: Path, column: str, value: Any) -> None:
    """Dropping the UPDATE trigger and editing any column of seq 3 makes verify_chain report seq 3."""
    with plain(db) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute(f"UPDATE events SET {column} = ? WHERE seq = 3", (value,))
    report = filled.verify_chain()
    assert not report.ok
    assert report.bad_seq == 3
    assert report.reason
    assert report.events == 5


def test_edited_link_alone_breaks_chain_at_that_seq(filled: SQLiteEventStore, db: Path) -> None:
    """Only `prev_hash` edited: the row's own hash still matches its content, the link does not."""
    with plain(db) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("UPDATE events SET prev_hash = ? WHERE seq = 3", ("f" * 64,))
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq) == (False, 3)
    assert report.reason is not None and "prev_hash" in report.reason


def test_deleted_row_breaks_chain_at_the_next_seq(filled: SQLiteEventStore, db: Path) -> None:
    """Dropping the DELETE trigger and removing seq 3 is caught at seq 4 (a gap)."""
    with plain(db) as conn:
        conn.execute("DROP TRIGGER events_refuse_delete")
        conn.execute("DELETE FROM events WHERE seq = 3")
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq) == (False, 4)


# --- files that are not ledgers -----------------------------------------------------------------


def test_random_bytes_file_is_store_error(tmp_path: Path) -> None:
    """Opening a file that is not an SQLite database is a StoreError."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"definitely not sqlite\n" * 200)
    with pytest.raises(StoreError, match="not a usable ledger"):
        SQLiteEventStore(path)


def test_store_schema_version_mismatch_is_store_error(filled: SQLiteEventStore, db: Path) -> None:
    """A file written by another store schema version is refused, not guessed at."""
    filled.close()
    with plain(db) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'store_schema_version'", (str(STORE_SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match="schema version"):
        SQLiteEventStore(db)


def test_a_version_1_file_gains_the_filter_indexes_when_opened(filled: SQLiteEventStore, db: Path) -> None:
    """A ledger written before the filter indexes gets them (and version 2) on first open; its log is untouched."""
    head = filled.head()
    filled.close()
    with plain(db) as conn:
        for name in ("events_type", "events_actor", "events_recorded_at"):
            conn.execute(f"DROP INDEX {name}")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'store_schema_version'")
    with SQLiteEventStore(db) as reopened:
        assert reopened.head() == head and reopened.verify_chain().ok
    with plain(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        version = conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()[0]
        plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN SELECT seq FROM events WHERE actor = 'x'"))
    assert {"events_type", "events_actor", "events_recorded_at"} <= names and version == "2"
    assert "INDEX events_actor (actor=?)" in plan


def test_bad_synchronous_mode_is_input_error(db: Path) -> None:
    """An unknown synchronous mode is refused before the file is touched."""
    with pytest.raises(InputError):
        SQLiteEventStore(db, synchronous="SOMETIMES")
    assert not db.exists()
