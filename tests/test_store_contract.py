"""One store contract, every backend: memory, an SQLite file and a PostgreSQL schema pass the same tests.

Appends, reads, expected versions, idempotency, transactions, the stream index,
checkpoints and the whole Ledger. The chain's tamper tests are in test_store_chain.py,
the multi-process ones in test_store_concurrency.py; what only one engine has (WAL,
sqlite3 triggers, PostgreSQL roles and timeouts) is in test_store_sqlite.py and
test_store_postgres.py. A new backend joins by adding itself to `tests/backends.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from backends import Backend
from conftest import Workspace, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import load_state, snapshot_json, take_checkpoint, verify
from lifecycle_fsm.store import (
    GENESIS_HASH,
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    EventFilter,
    EventStore,
    Head,
    InputError,
    IntegrityError,
    MemoryEventStore,
    NewEvent,
    PayloadMatch,
    StreamHead,
    canonical_json,
    event_hash,
)
from lifecycle_fsm.store.base import event_at, hash_at, select_events, verify_chain
from lifecycle_fsm.store.chain import fold_columns, stamp_limit
from lifecycle_fsm.store.records import StreamShare


@pytest.fixture
def store(backend: Backend) -> Iterator[EventStore]:
    opened = backend.open()
    yield opened
    opened.close()


def new(stream: str = "s", n: int = 0, *, event_id: str | None = None, **payload: Any) -> NewEvent:
    """A small deterministic event (fixed clock and actor, so hashes compare across backends)."""
    return NewEvent(
        stream, "Happened", 1, payload or {"n": n}, event_id or f"{stream}-{n}", f"2024-01-01T00:00:{n % 60:02d}Z", "t"
    )


@pytest.fixture
def filled(store: EventStore) -> EventStore:
    """Five events over two streams: a0 a1 b0 a2 b1 (seq 1..5)."""
    store.append("a", 0, [new("a", 0), new("a", 1)])
    store.append("b", 0, [new("b", 0)])
    store.append("a", 2, [new("a", 2)])
    store.append("b", 1, [new("b", 1)])
    return store


# --- appends and reads -------------------------------------------------------------------------


def test_empty_store_reads(store: EventStore) -> None:
    """A fresh store has no events, version 0 everywhere and the genesis head."""
    assert store.head() == Head(0, GENESIS_HASH)
    assert (store.stream_version("x"), store.read_stream("x"), list(select_events(store))) == (0, [], [])
    assert (event_at(store, 1), store.event_by_id("nope"), store.count_events()) == (None, None, 0)
    assert list(store.select_rows()) == [] and list(store.select_checkpoints()) == []
    assert verify_chain(store).ok


def test_append_assigns_seq_version_and_chain(store: EventStore) -> None:
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
    assert list(select_events(store)) == events  # what was returned is what was stored


def test_reads_return_what_was_stored(filled: EventStore) -> None:
    """read_stream, stream_version, head, event_at, event_by_id and hash_at agree with select_events."""
    everything = list(select_events(filled))
    assert [e.seq for e in everything] == [1, 2, 3, 4, 5]
    assert [e.event_id for e in filled.read_stream("a")] == ["a-0", "a-1", "a-2"]
    assert [e.version for e in filled.read_stream("a", after_version=1)] == [2, 3]
    assert [e.version for e in filled.read_stream("b")] == [1, 2]
    assert (filled.stream_version("a"), filled.stream_version("b"), filled.stream_version("c")) == (3, 2, 0)
    assert filled.head() == Head(5, everything[-1].hash)
    assert event_at(filled, 3) == everything[2] and event_at(filled, 6) is None
    assert filled.event_by_id("b-1") == everything[4]
    assert filled.count_events() == 5
    assert (
        hash_at(filled, 0) == GENESIS_HASH and hash_at(filled, 2) == everything[1].hash and hash_at(filled, 6) is None
    )
    rows = [row for batch in filled.select_rows(EventFilter(after=1, before=5)) for row in batch]
    assert rows == [attrs.astuple(e) for e in everything[1:4]]


def test_select_rows_bounds(filled: EventStore) -> None:
    """select_rows yields after < seq < before, in order, the first `limit` of them."""
    assert _seqs(filled, after=2) == [3, 4, 5]
    assert _seqs(filled, before=3) == [1, 2]
    assert _seqs(filled, after=1, before=5) == [2, 3, 4]
    assert _seqs(filled, after=1, before=5, limit=2) == [2, 3]
    assert _seqs(filled, after=5) == [] and _seqs(filled, limit=0) == []


def test_select_fold_rows_are_the_rows_fold_columns(filled: EventStore) -> None:
    """select_fold_rows gives the same slice as select_rows, each row cut to its six fold columns."""
    for after, before in ((0, None), (1, 5), (2, None), (0, 3), (5, None)):
        whole = [row for batch in filled.select_rows(EventFilter(after=after, before=before)) for row in batch]
        cut = [row for batch in filled.select_fold_rows(after=after, before=before) for row in batch]
        assert [tuple(row) for row in cut] == [fold_columns(row) for row in whole]
    assert list(filled.select_fold_rows(after=5, before=None)) == []  # no empty batch past the head


def test_select_fold_rows_of_a_share_of_the_streams(store: EventStore) -> None:
    """A share's fold rows are its streams' (or every stream but those), in seq order, also when the
    share has no row in the first thousands of seqs (a backend reading pages of seqs goes past them)."""
    for batch in range(25):
        store.append("a", batch * 100, [new("a", batch * 100 + i) for i in range(100)])
    store.append("b", 0, [new("b", i) for i in range(3)])
    store.append("a", 2500, [new("a", 2500)])
    store.append("c", 0, [new("c", 0)])

    def read(share: StreamShare) -> list[tuple[int, str]]:
        return [
            (row[0], row[1]) for rows in store.select_fold_rows(after=0, before=None, streams=share) for row in rows
        ]

    assert read(StreamShare(frozenset({"b"}))) == [(2501, "b"), (2502, "b"), (2503, "b")]
    assert read(StreamShare(frozenset({"b", "c"}))) == [(2501, "b"), (2502, "b"), (2503, "b"), (2505, "c")]
    assert read(StreamShare(frozenset({"b"}), others=True)) == [(seq, "a") for seq in range(1, 2501)] + [
        (2504, "a"),
        (2505, "c"),
    ]
    assert read(StreamShare(frozenset())) == []
    within = store.select_fold_rows(after=2501, before=2505, streams=StreamShare(frozenset({"a", "b"})))
    assert [row[0] for rows in within for row in rows] == [2502, 2503, 2504]


def test_select_events_streams_a_large_log(store: EventStore) -> None:
    """5000 events appended in 50 batches come back in seq order, each once, with per-stream versions."""
    for batch in range(50):
        stream = "even" if batch % 2 == 0 else "odd"
        base = store.stream_version(stream)
        store.append(stream, base, [new(stream, base + i) for i in range(100)])
    events = select_events(store)
    assert iter(events) is events  # a generator, not a list built up front
    count, last_seq, versions = 0, 0, {"even": 0, "odd": 0}
    for e in events:
        count += 1
        assert e.seq == last_seq + 1
        assert e.version == versions[e.stream_id] + 1
        last_seq, versions[e.stream_id] = e.seq, e.version
    assert (count, versions) == (5000, {"even": 2500, "odd": 2500})
    assert sum(len(b) for b in store.select_rows()) == 5000
    assert verify_chain(store).ok


def test_transaction_spans_streams_and_rolls_back(store: EventStore) -> None:
    """Everything appended inside one transaction lands together or not at all; it sees its own appends."""
    with store.transaction() as tx:
        tx.append("a", 0, [new("a", 0)])
        tx.append("b", 0, [new("b", 0)])
        assert tx.stream_version("a") == 1 and [e.version for e in tx.read_stream("a")] == [1]
        assert [(h.stream_id, h.version) for h in tx.streams()] == [("a", 1), ("b", 1)]
    assert store.count_events() == 2

    def abandon() -> None:
        with store.transaction() as tx:
            tx.append("a", 1, [new("a", 1)])
            tx.append("z", 0, [new("z", 0)])
            assert tx.stream_version("a") == 2  # visible inside
            raise RuntimeError("abandon")

    with pytest.raises(RuntimeError):
        abandon()
    assert (store.count_events(), store.stream_version("a")) == (2, 1)
    assert [(h.stream_id, h.version) for h in store.streams()] == [("a", 1), ("b", 1)]
    assert store.append("c", 0, [new("c", 0)]).events[0].seq == 3  # the abandoned seq is reused: no gap


def test_expect_inside_a_transaction(store: EventStore) -> None:
    """A transaction that read a stream at a version that moved appends nothing (the command re-decides)."""
    store.append("ledger", 0, [new("ledger", 0)])
    with store.transaction() as tx:
        tx.append("a", 0, [new("a", 0)], expect=[("ledger", 1)])

    def stale(expected: int, append: bool) -> None:
        with store.transaction() as tx:
            tx.append("a", 1, [new("a", 1)] if append else [], expect=[("ledger", expected)])

    with pytest.raises(ConcurrencyError) as info:
        stale(0, append=True)
    assert (info.value.stream_id, info.value.expected_version, info.value.actual_version) == ("ledger", 0, 1)
    with pytest.raises(ConcurrencyError):
        stale(7, append=False)
    assert store.count_events() == 2


def test_append_expecting_other_streams(backend: Backend, store: EventStore) -> None:
    """`append(..., expect=)`: one transaction that asserts the versions of streams it does not write.

    A second handle moves the ledger stream, so the first handle's own head guess is
    stale too (PostgreSQL's one-round-trip path then re-reads under the lock); a retry
    of an append already stored still returns it, whatever moved since.
    """
    store.append("ledger", 0, [new("ledger", 0)])
    done = store.append("a", 0, [new("a", 0)], expect=[("ledger", 1)])
    assert [e.version for e in done.events] == [1]
    other = backend.open()
    try:
        other.append("ledger", 1, [new("ledger", 1)])
        for stale in ([("ledger", 1)], [("b", 0), ("ledger", 3)]):
            with pytest.raises(ConcurrencyError) as info:
                store.append("a", 1, [new("a", 1)], expect=stale)
            assert (info.value.stream_id, info.value.actual_version) == ("ledger", 2)
        assert store.count_events() == 3 and store.stream_version("a") == 1
        again = store.append("a", 0, [new("a", 0)], expect=[("ledger", 1)])
        assert again.duplicate and again.events == done.events
        moved = store.append("a", 1, [new("a", 1)], expect=[("ledger", 2), ("b", 0)])
        assert moved.events[0].seq == 4 and verify_chain(store).ok
    finally:
        if other is not store:
            other.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("event_id", 5),
        ("event_id", 5.5),
        ("actor", True),
        ("recorded_at", None),
        ("type", b"T"),
        ("schema_version", True),
        ("schema_version", "1"),
        ("payload", [1, 2]),
        ("actor", "t\ud800"),
        ("event_id", "a-\udfff"),
        ("actor", "t\x00"),
        ("schema_version", 2**63),
        ("schema_version", 2**40),
        ("schema_version", 0),
    ],
)
def test_a_column_of_the_wrong_type_is_refused_before_anything_is_written(
    store: EventStore, column: str, value: Any
) -> None:
    """Hashed as given but stored as text (event id 5 as "5"), such a row would break the chain
    for good; every backend refuses it with InputError, in a batch too, and writes nothing."""
    store.append("a", 0, [new("a", 0)])
    fields = {
        "stream_id": "a",
        "type": "Happened",
        "schema_version": 1,
        "payload": {"n": 1},
        "event_id": "a-1",
        "recorded_at": "2024-01-01T00:00:01Z",
        "actor": "t",
    } | {column: value}
    with pytest.raises(InputError, match=column):
        store.append("a", 1, [new("a", 1), NewEvent(**fields)])
    assert store.count_events() == 1 and verify_chain(store).ok
    assert store.append("a", 1, [new("a", 1)]).events[0].seq == 2


def test_a_read_snapshot_holds_while_another_handle_appends(backend: Backend, store: EventStore) -> None:
    """Inside `read_snapshot()` every read sees the ledger as of its first read; another handle's
    append (its own thread, as each handle must be) shows only once it ends. SQLite and
    PostgreSQL let the writer commit meanwhile; memory makes it wait."""
    store.append("a", 0, [new("a", 0)])
    before = store.head()
    committed = threading.Event()

    def write() -> None:
        other = backend.open()
        try:
            other.append("a", 1, [new("a", 1)])
            committed.set()
        finally:
            if other is not store:
                other.close()

    writer = threading.Thread(target=write)
    with store.read_snapshot():
        assert store.head() == before
        writer.start()
        committed.wait(timeout=1.0 if backend.name == "memory" else 30.0)
        assert committed.is_set() is (backend.name != "memory")
        with store.read_snapshot():  # nested: the same snapshot
            assert (store.head(), store.count_events(), store.stream_version("a")) == (before, 1, 1)
        assert [e.seq for e in select_events(store)] == [1] and store.streams()[0].version == 1
    writer.join(timeout=30)
    assert committed.is_set() and store.head().seq == 2 and store.stream_version("a") == 2


def test_a_write_inside_a_read_snapshot_is_refused(store: EventStore) -> None:
    """A write through the handle holding a snapshot is refused before anything is written."""
    store.append("a", 0, [new("a", 0)])
    with store.read_snapshot():
        for write in (
            lambda: store.append("a", 1, [new("a", 1)]),
            lambda: store.transaction().__enter__(),
            lambda: store.append_checkpoint(
                position=1, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t"
            ),
            lambda: store.rebuild_stream_index(lambda: []),
        ):
            with pytest.raises(InputError, match="read_snapshot"):
                write()
        assert store.count_events() == 1
    assert store.append("a", 1, [new("a", 1)]).events[0].seq == 2
    assert list(store.select_checkpoints()) == [] and store.streams()[0].version == 2
    with store.transaction() as tx:  # and the other way round: a write transaction's reads are its own
        tx.append("a", 2, [new("a", 2)])
        with pytest.raises(InputError, match="read_snapshot"), store.read_snapshot():
            pass
    assert store.count_events() == 3 and verify_chain(store).ok


# --- atomic batches and input ----------------------------------------------------------------


def test_batch_with_unencodable_second_event_leaves_nothing(store: EventStore) -> None:
    """A batch whose 2nd event has a NaN payload is refused whole: no rows, head unchanged."""
    with pytest.raises(InputError, match="non-finite"):
        store.append("a", 0, [new("a", 0), new("a", 1, x=float("nan")), new("a", 2)])
    assert (store.count_events(), store.stream_version("a"), store.head()) == (0, 0, Head(0, GENESIS_HASH))
    assert store.streams() == []


def test_batch_failing_in_the_database_leaves_nothing(store: EventStore) -> None:
    """A batch whose 2nd row takes an existing event id rolls back its 1st row too (looked up or promised fresh)."""
    store.append("b", 0, [new("b", 0, event_id="taken")])
    with pytest.raises(DuplicateEventError) as info:
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")])
    assert (info.value.event_id, info.value.seq) == ("taken", 1)
    with pytest.raises(ConflictError):  # promised fresh: the database refuses the row (memory finds it)
        store.append("a", 0, [new("a", 0), new("a", 1, event_id="taken")], fresh_ids=True)
    assert (store.count_events(), store.stream_version("a")) == (1, 0)
    assert store.append("a", 0, [new("a", 0)]).events[0].seq == 2


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_float_is_input_error(store: EventStore, bad: float) -> None:
    """A non-finite number anywhere in a payload is an InputError (JSON cannot carry it)."""
    with pytest.raises(InputError):
        store.append("a", 0, [new("a", 0, nested={"list": [1.0, bad]})])
    assert store.count_events() == 0


def test_unserialisable_payload_is_input_error(store: EventStore) -> None:
    """A payload JSON cannot carry (a set, bytes) is refused before anything is written."""
    with pytest.raises(InputError, match="not JSON-serialisable"):
        store.append("a", 0, [new("a", 0, tags={"x", "y"})])
    assert store.count_events() == 0


def test_event_of_another_stream_is_input_error(store: EventStore) -> None:
    """Every event of an append must belong to the stream being appended to."""
    with pytest.raises(InputError):
        store.append("a", 0, [new("a", 0), new("b", 0)])
    assert store.count_events() == 0


def test_payload_text_is_kept_exactly(store: EventStore) -> None:
    """Unicode, escapes, big and float numbers and key order come back byte for byte (no jsonb rewriting)."""
    payload = {"z": 1, "a": 'é\u2028"\\', "big": 12345678901234567, "f": 1e100, "g": 0.1, "nested": {"b": [], "a": {}}}
    stored = store.append("a", 0, [new("a", 0, **payload)]).events[0]
    assert stored.payload == canonical_json(payload)
    assert event_at(store, 1) == stored and verify_chain(store).ok


# --- expected versions and idempotency ---------------------------------------------------------


@pytest.mark.parametrize("expected", [0, 2, 7])
def test_wrong_expected_version(store: EventStore, expected: int) -> None:
    """Appending at a version other than the stream's is a ConcurrencyError with structured fields."""
    store.append("a", 0, [new("a", 0)])
    with pytest.raises(ConcurrencyError) as info:
        store.append("a", expected, [new("a", 1)])
    assert (info.value.stream_id, info.value.expected_version, info.value.actual_version) == ("a", expected, 1)
    assert store.count_events() == 1


def test_retry_is_a_no_op_and_reuse_is_an_error(store: EventStore) -> None:
    """Same ids and content: the original positions, even after the stream moved on; other content: an error."""
    original = store.append("a", 0, [new("a", 0), new("a", 1)])
    store.append("a", 2, [new("a", 2)])
    again = store.append("a", 0, [new("a", 0), new("a", 1)])
    assert again.duplicate and again.events == original.events
    with pytest.raises(DuplicateEventError) as info:
        store.append("a", 3, [new("a", 3, event_id="a-0")])
    assert (info.value.event_id, info.value.seq) == ("a-0", 1)
    with pytest.raises(DuplicateEventError):
        store.append("b", 0, [new("b", 0, event_id="a-0")])  # same id, another stream
    with pytest.raises(DuplicateEventError):
        store.append("b", 0, [new("b", 1), new("b", 2, event_id="a-1")])  # half taken
    assert store.count_events() == 3


# --- the stream index and checkpoints ------------------------------------------------------------


def test_state_index_moves_at_checkpoints_and_rebuilds_never_at_a_commit(store: EventStore) -> None:
    """A commit writes no index row: `streams()` gives every stream at its log version, labelled only
    where the index's position covers it; a checkpoint's index moves it (never back); rebuild sets it."""
    store.append("a", 0, [new("a", 1)])
    store.append("b", 0, [new("b", 1)])
    assert store.state_index() == (0, [])
    assert store.streams() == [StreamHead("a", 1, None, None), StreamHead("b", 1, None, None)]
    labelled = [StreamHead("a", 1, "received", "grpo"), StreamHead("b", 1, "ready", "dpo")]
    store.append_checkpoint(
        position=2, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t", index=labelled
    )
    assert store.state_index() == (2, labelled) and store.streams() == labelled
    store.append("a", 1, [new("a", 2)])  # past the index: its version from the log, no label
    assert store.streams() == [StreamHead("a", 2, None, None), StreamHead("b", 1, "ready", "dpo")]
    store.append_checkpoint(  # an older position never moves the index back
        position=1, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t", index=[]
    )
    assert store.state_index() == (2, labelled)
    store.rebuild_stream_index(lambda: [StreamHead("a", 2, "reject", "grpo"), StreamHead("b", 1, "ready", "dpo")])
    assert store.state_index()[0] == 3 and store.streams()[0] == StreamHead("a", 2, "reject", "grpo")


def test_checkpoints_and_stream_copies(store: EventStore) -> None:
    """Checkpoints come back newest first (lazily, filtered) with the chain's hash; copies are found per stream."""
    store.append("a", 0, [new("a", 1), new("a", 2)])
    first = store.append_checkpoint(position=1, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    second = store.append_checkpoint(
        position=2, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t", streams=[("a", 2, '{"s":1}')]
    )
    third = store.append_checkpoint(position=2, schema_version=1, fingerprint="g", snapshot="[]", recorded_at="u")
    assert [c.checkpoint_id for c in store.select_checkpoints()] == [
        third.checkpoint_id,
        second.checkpoint_id,
        first.checkpoint_id,
    ]
    assert [c.checkpoint_id for c in store.select_checkpoints(at_or_before=1)] == [first.checkpoint_id]
    assert next(iter(store.select_checkpoints())) == third
    assert first.head_hash == hash_at(store, 1) and second.head_hash == hash_at(store, 2)
    copy = store.latest_stream_snapshot("a")
    assert copy is not None and (copy.version, copy.state, copy.position) == (2, '{"s":1}', 2)
    assert [s.stream_id for s in store.stream_snapshots(second.checkpoint_id)] == ["a"]
    assert store.stream_snapshots(third.checkpoint_id) == [] and store.latest_stream_snapshot("b") is None
    with pytest.raises(IntegrityError):
        store.append_checkpoint(position=9, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    genesis = store.append_checkpoint(position=0, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    assert genesis.head_hash == GENESIS_HASH


def test_a_second_handle_sees_the_same_ledger(backend: Backend, store: EventStore) -> None:
    """Another handle on the same ledger (another process, in real life) sees the first's writes; both append."""
    store.append("a", 0, [new("a", 0)])
    other = backend.open()
    try:
        assert other.head() == store.head()
        other.append("a", 1, [new("a", 1)])
        assert store.append("a", 2, [new("a", 2)]).events[0].seq == 3  # its guess of the head was stale
        assert verify_chain(store).ok and other.count_events() == 3
    finally:
        if other is not store:
            other.close()


def test_the_ledger_runs_on_every_backend(backend: Backend, store: EventStore, ws: Workspace) -> None:
    """The whole lifecycle through the Ledger; replay, checkpoint + tail and verify agree."""
    ledger = Ledger(store, actor="contract")
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    ledger.receive(ws.grpo())
    ledger.check("dpo-v5")
    take_checkpoint(store, clock=utc_now)
    ledger.hand_off("dpo-v5")
    ledger.advance_window(2)
    assert ledger.candidate("dpo-v5").state == "ready"
    full = load_state(store, use_checkpoints=False)
    assert snapshot_json(load_state(store).state) == snapshot_json(full.state)
    assert {cid: c.state for cid, c in full.state.candidates.items()} == {"dpo-v5": "ready", "grpo-v7": "received"}
    assert verify(store)["ok"]


# --- the auditor's filtered read (`select_rows`, `position_at`) --------------------------------

FILTER_LOG = [
    # stream, type, actor, recorded_at, payload
    ("ledger", "Init", "ops", "2026-01-01T00:00:00.000000Z", {"window": 1}),
    ("c:a", "Checked", "sup", "2026-01-01T00:00:01.000000Z", {"reason_codes": ["artifact", "rollback"], "ok": False}),
    ("c:b", "Checked", "sup", "2026-01-01T00:00:02.500000Z", {"reason_codes": [], "ok": True}),
    ("c:b", "Planned", "ops", "2026-01-01T00:00:03.000000Z", {"action": "block_update", "nested": {"x": "artifact"}}),
    ("c:a", "Handed", "sup", "2026-01-01T00:00:04.000000Z", {"reason_codes": ["upstream_reject"], "note": 'a "q"'}),
    ("c:c", "Checked", "ops", "2026-01-01T00:00:04.000000Z", {"reason_codes": ["artifact"], "action": "artifact"}),
    ("c:a", "Planned", "sup", "2026-01-01T00:00:05.000000Z", {"action": "artifact", "reason_codes": "artifact"}),
]


def _filled(store: EventStore, *, index_after: int | None = None) -> EventStore:
    """`FILTER_LOG` appended; an SQL store's event index brought up to date after `index_after` rows."""
    versions: dict[str, int] = {}
    for i, (stream, type_name, actor, at, payload) in enumerate(FILTER_LOG):
        version = versions.get(stream, 0)
        store.append(stream, version, [NewEvent(stream, type_name, 1, payload, f"f{i}", at, actor)])
        versions[stream] = version + 1
        if i + 1 == index_after and hasattr(store, "catch_up_index"):
            store.catch_up_index()
    return store


def _seqs(store: EventStore, **query: Any) -> list[int]:
    return [row[0] for batch in store.select_rows(EventFilter(**query)) for row in batch]


def test_select_rows_applies_each_condition(store: EventStore) -> None:
    """Every filter field alone, then together: positions exclusive, times inclusive, the first N in seq order."""
    _filled(store)
    assert _seqs(store) == [1, 2, 3, 4, 5, 6, 7]
    assert _seqs(store, after=2, before=6) == [3, 4, 5]
    assert _seqs(store, since="2026-01-01T00:00:02.500000Z", until="2026-01-01T00:00:04.000000Z") == [3, 4, 5, 6]
    assert _seqs(store, types=("Checked", "Handed")) == [2, 3, 5, 6]
    assert _seqs(store, stream_id="c:a") == [2, 5, 7]
    assert _seqs(store, actor="ops") == [1, 4, 6]
    assert _seqs(store, limit=2, after=3) == [4, 5]
    assert _seqs(store, types=("Checked",), actor="ops", after=1, limit=5) == [6]


def test_select_rows_payload_values_at_their_path_only(store: EventStore) -> None:
    """A value matches at its path (a scalar equal to it, or an array holding it), never elsewhere in the payload."""
    _filled(store)
    checked = PayloadMatch("Checked", "$.reason_codes", "artifact")
    assert _seqs(store, payload=(checked,)) == [2, 6]  # not seq 7 (another type), not seq 4's nested value
    planned = PayloadMatch("Planned", "$.action", "block_update")
    assert _seqs(store, payload=(checked, planned)) == [2, 4, 6]
    assert _seqs(store, payload=(PayloadMatch("Planned", "$.nested", "artifact"),)) == []  # an object is not searched
    assert _seqs(store, payload=(PayloadMatch("Planned", "$.nested.x", "artifact"),)) == [4]
    assert _seqs(store, payload=(PayloadMatch("Handed", "$.note", 'a "q"'),)) == [5]  # the JSON text, escapes and all
    assert _seqs(store, payload=(PayloadMatch("Checked", "$.missing", "artifact"),)) == []
    assert _seqs(store, payload=(checked,), before=6) == [2]


def test_position_at_is_the_last_seq_recorded_by_then(store: EventStore) -> None:
    """As-of a time, times in seq order: the last seq recorded at or before it (two events share a time:
    both are in)."""
    assert store.position_at("2026-01-01T00:00:00.000000Z") == 0
    _filled(store)
    assert store.position_at("2025-12-31T23:59:59.999999Z") == 0
    assert store.position_at("2026-01-01T00:00:00.000000Z") == 1
    assert store.position_at("2026-01-01T00:00:04.000000Z") == 6
    assert store.position_at("2026-01-01T00:00:04.999999Z") == 6
    assert store.position_at("2099-01-01T00:00:00.000000Z") == 7


def _times(store: EventStore, after: int = 0) -> list[str]:
    return [e.recorded_at for e in select_events(store) if e.seq > after]


def test_a_time_never_goes_back_along_the_log(store: EventStore) -> None:
    """A command's time is read before the write lock: an append that finds a later time at the head (another
    writer, another machine's clock) stores the head's, in a batch too, so a time names a prefix of the log.
    A time not in the ledger's form is stored as given, and none is stamped after one."""
    _filled(store)
    at = "2026-01-01T00:00:0{}.000000Z".format
    store.append("c:d", 0, [NewEvent("c:d", "Checked", 1, {}, "late0", at(6), "sup")])
    store.append("c:e", 0, [NewEvent("c:e", "Checked", 1, {}, "late1", at(4), "sup")])
    batch = [NewEvent("c:f", "Checked", 1, {}, f"b{n}", at(n), "sup") for n in (3, 7, 5)]
    assert [e.recorded_at for e in store.append("c:f", 0, batch).events] == [at(6), at(7), at(7)]
    store.append("c:g", 0, [NewEvent("c:g", "Checked", 1, {}, "odd", "yesterday", "sup")])
    store.append("c:h", 0, [NewEvent("c:h", "Checked", 1, {}, "after-odd", at(1), "sup")])
    assert _times(store, after=7) == [at(6), at(6), at(6), at(7), at(7), "yesterday", at(1)]
    assert store.position_at(at(5)) == 7
    assert store.position_at(at(6)) == 10
    # A head more than STAMP_LEAD (5 minutes) ahead of a writer's clock is not passed on (a clock far wrong).
    store.append("c:i", 0, [NewEvent("c:i", "Checked", 1, {}, "ahead", "2026-01-01T00:10:00.000000Z", "sup")])
    store.append("c:j", 0, [NewEvent("c:j", "Checked", 1, {}, "behind", at(2), "sup")])
    store.append("c:k", 0, [NewEvent("c:k", "Checked", 1, {}, "near", "2026-01-01T00:05:00.000000Z", "sup")])
    assert _times(store, after=14) == ["2026-01-01T00:10:00.000000Z", at(2), "2026-01-01T00:05:00.000000Z"]
    assert stamp_limit(at(2)) == "2026-01-01T00:05:02.000000Z" and stamp_limit("yesterday") == ""
    assert verify_chain(store).ok


@pytest.mark.parametrize("indexed", ["none", "part", "all"])
def test_as_of_a_time_takes_in_no_event_recorded_after_it(store: EventStore, indexed: str) -> None:
    """A log whose times go back (written before times were stamped after the head's; here events copied with
    their times): a command stamped at :06 commits (seq 8) before one stamped at :04.5 (seq 9). As of :05 the
    log stops at seq 7, though seq 9 was recorded by then: never seq 8, recorded later. So on every backend,
    with the event index holding none, part or all of the log."""
    _filled(store, index_after=2 if indexed == "part" else None)
    with store.transaction() as tx:
        for seq, (stream, at) in enumerate(
            [("c:d", "2026-01-01T00:00:06.000000Z"), ("c:e", "2026-01-01T00:00:04.500000Z")]
        ):
            tx.append(stream, 0, [NewEvent(stream, "Checked", 1, {}, f"late{seq}", at, "sup")], copied=True)
    if indexed == "all" and hasattr(store, "catch_up_index"):
        store.catch_up_index()
    assert store.position_at("2026-01-01T00:00:05.000000Z") == 7
    assert store.position_at("2026-01-01T00:00:05.999999Z") == 7
    assert store.position_at("2026-01-01T00:00:06.000000Z") == 9
    assert store.position_at("2026-01-01T00:00:04.000000Z") == 6


_maybe_seq = st.none() | st.integers(0, 8)
_maybe_time = st.none() | st.sampled_from(sorted({row[3] for row in FILTER_LOG}))


@pytest.fixture
def filter_log(backend: Backend) -> Iterator[EventStore]:
    """`FILTER_LOG` in the backend under test, written once for all of a property test's examples; its
    event index holds the first four rows (a read takes the rest from the log)."""
    store = _filled(backend.open(), index_after=4)
    yield store
    store.close()


_REFERENCE = _filled(MemoryEventStore())


@settings(max_examples=examples(30, 60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    after=st.integers(0, 8),
    before=_maybe_seq,
    since=_maybe_time,
    until=_maybe_time,
    types=st.lists(st.sampled_from(["Checked", "Planned", "Handed", "Init", "None"]), max_size=2).map(tuple),
    stream_id=st.none() | st.sampled_from(["c:a", "c:b", "ledger", "nope"]),
    actor=st.none() | st.sampled_from(["sup", "ops"]),
    code=st.none() | st.sampled_from(["artifact", "rollback", "upstream_reject", "block_update"]),
    limit=st.none() | st.integers(0, 4),
)
def test_every_backend_agrees_with_the_reference_on_any_filter(
    filter_log: EventStore, code: str | None, **query: Any
) -> None:
    """The pushed-down query (SQLite's, PostgreSQL's) returns exactly what the in-memory reference
    returns, for any combination of conditions."""
    matches = (
        ()
        if code is None
        else (PayloadMatch("Checked", "$.reason_codes", code), PayloadMatch("Planned", "$.action", code))
    )
    assert _seqs(filter_log, payload=matches, **query) == _seqs(_REFERENCE, payload=matches, **query)
