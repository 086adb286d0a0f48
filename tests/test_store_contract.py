"""One contract, every backend: SQLite and the in-memory reference pass the same tests.

A new backend (PostgreSQL) joins by adding itself to `BACKENDS`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Workspace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_fsm.errors import ConcurrencyError, DuplicateEventError, IntegrityError
from lifecycle_fsm.ledger import Ledger, utc_now
from replay import load_state, snapshot_json, take_checkpoint, verify
from store import (
    GENESIS_HASH,
    EventFilter,
    EventStore,
    MemoryEventStore,
    NewEvent,
    PayloadMatch,
    SQLiteEventStore,
    StreamHead,
)

BACKENDS: dict[str, Callable[[Path], EventStore]] = {
    "sqlite": lambda tmp: SQLiteEventStore(tmp / "contract.db", synchronous="NORMAL"),
    "memory": lambda tmp: MemoryEventStore(),
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    backend = BACKENDS[request.param](tmp_path)
    yield backend
    backend.close()


def ev(stream: str, n: int, *, event_id: str | None = None, payload: dict[str, object] | None = None) -> NewEvent:
    """A deterministic event (fixed clock and actor, so hashes compare across backends)."""
    return NewEvent(
        stream, "T", 1, payload or {"n": n, "note": None}, event_id or f"{stream}-{n}", "2026-01-01T00:00:00Z", "t"
    )


def test_append_and_read_back(store: EventStore) -> None:
    """Positions, versions, the head and the look-ups agree after appends to two streams."""
    first = store.append("a", 0, [ev("a", 1), ev("a", 2)], status="received", category="dpo")
    store.append("b", 0, [ev("b", 1)])
    assert [e.seq for e in first.events] == [1, 2]
    assert [e.version for e in store.read_stream("a")] == [1, 2]
    assert [e.version for e in store.read_stream("a", after_version=1)] == [2]
    assert store.stream_version("a") == 2 and store.stream_version("nope") == 0
    assert store.head().seq == 3 and store.count_events() == 3
    assert store.event_at(3) == store.event_by_id("b-1")
    assert store.hash_at(0) == GENESIS_HASH and store.hash_at(4) is None
    assert [e.seq for e in store.select_events(after=1, to=2)] == [2]
    assert [r[0] for rows in store.select_fold_batches() for r in rows] == [1, 2, 3]


def test_expected_version_is_enforced(store: EventStore) -> None:
    """Appending at a stale version is a ConcurrencyError naming both versions, and appends nothing."""
    store.append("a", 0, [ev("a", 1)])
    with pytest.raises(ConcurrencyError) as info:
        store.append("a", 0, [ev("a", 2)])
    assert (info.value.expected_version, info.value.actual_version) == (0, 1)
    assert store.count_events() == 1


def test_retry_is_a_no_op_and_reuse_is_an_error(store: EventStore) -> None:
    """Same ids and content: the original positions; other content, or a half-taken batch: an error."""
    original = store.append("a", 0, [ev("a", 1), ev("a", 2)])
    again = store.append("a", 0, [ev("a", 1), ev("a", 2)])
    assert again.duplicate and again.events == original.events
    with pytest.raises(DuplicateEventError):
        store.append("a", 2, [ev("a", 3, event_id="a-1")])
    with pytest.raises(DuplicateEventError):
        store.append("b", 0, [ev("b", 1), ev("b", 2, event_id="a-2")])
    assert store.count_events() == 2


def test_transaction_is_all_or_nothing(store: EventStore) -> None:
    """An error inside a transaction leaves none of its appends behind."""

    def abort_midway() -> None:
        with store.transaction() as tx:
            tx.append("a", 0, [ev("a", 1)])
            assert tx.stream_version("a") == 1  # visible inside
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        abort_midway()
    assert store.count_events() == 0
    assert store.streams() == []


def test_chain_is_identical_across_backends(tmp_path: Path) -> None:
    """The same events give the same hashes on every backend: the chain is the data's, not the engine's."""
    heads = []
    for name, make in sorted(BACKENDS.items()):
        backend = make(tmp_path)
        backend.append("a", 0, [ev("a", 1), ev("a", 2)])
        backend.append("b", 0, [ev("b", 1, payload={"x": [1, 2.5, "é"]})])
        assert backend.verify_chain().ok, name
        heads.append(backend.head())
        backend.close()
    assert heads[0] == heads[1]


def test_stream_index_labels_and_rebuild(store: EventStore) -> None:
    """The index keeps the last label given; a later append without one keeps it; rebuild replaces it."""
    store.append("a", 0, [ev("a", 1)], status="received", category="grpo")
    store.append("a", 1, [ev("a", 2)])
    store.append("b", 0, [ev("b", 1)], status="ready", category="dpo")
    assert store.streams(statuses=["received"]) == [StreamHead("a", 2, "received", "grpo")]
    store.rebuild_stream_index(lambda: [StreamHead("b", 1, "reject", "dpo")])
    assert store.streams() == [StreamHead("b", 1, "reject", "dpo")]


def test_checkpoints_and_stream_copies(store: EventStore) -> None:
    """Checkpoints come back newest first with the chain's hash; stream copies are found per stream."""
    store.append("a", 0, [ev("a", 1), ev("a", 2)])
    first = store.append_checkpoint(position=1, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    second = store.append_checkpoint(
        position=2, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t", streams=[("a", 2, '{"s":1}')]
    )
    assert [c.checkpoint_id for c in store.select_checkpoints()] == [second.checkpoint_id, first.checkpoint_id]
    assert first.head_hash == store.hash_at(1)
    copy = store.latest_stream_snapshot("a")
    assert copy is not None and (copy.version, copy.state, copy.position) == (2, '{"s":1}', 2)
    assert [s.stream_id for s in store.stream_snapshots(second.checkpoint_id)] == ["a"]
    assert store.latest_stream_snapshot("b") is None
    with pytest.raises(IntegrityError):
        store.append_checkpoint(position=9, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")


def test_the_ledger_runs_on_every_backend(store: EventStore, ws: Workspace) -> None:
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


# --- the auditor's filtered read (`select_matching`, `position_at`) ---------------------------

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


def _filled(store: EventStore) -> EventStore:
    versions: dict[str, int] = {}
    for i, (stream, type_name, actor, at, payload) in enumerate(FILTER_LOG):
        version = versions.get(stream, 0)
        store.append(stream, version, [NewEvent(stream, type_name, 1, payload, f"f{i}", at, actor)])
        versions[stream] = version + 1
    return store


def _seqs(store: EventStore, **query: Any) -> list[int]:
    return [e.seq for e in store.select_matching(EventFilter(**query))]


def test_select_matching_applies_each_condition(store: EventStore) -> None:
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


def test_select_matching_payload_values_at_their_path_only(store: EventStore) -> None:
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
    """As-of a time: the last seq recorded at or before it (two events share a time: both are in)."""
    assert store.position_at("2026-01-01T00:00:00.000000Z") == 0
    _filled(store)
    assert store.position_at("2025-12-31T23:59:59.999999Z") == 0
    assert store.position_at("2026-01-01T00:00:00.000000Z") == 1
    assert store.position_at("2026-01-01T00:00:04.000000Z") == 6
    assert store.position_at("2026-01-01T00:00:04.999999Z") == 6
    assert store.position_at("2099-01-01T00:00:00.000000Z") == 7


_maybe_seq = st.none() | st.integers(0, 8)
_maybe_time = st.none() | st.sampled_from(sorted({row[3] for row in FILTER_LOG}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
def test_sqlite_agrees_with_the_reference_on_any_filter(tmp_path: Path, code: str | None, **query: Any) -> None:
    """SQLite's pushed-down query returns exactly what the in-memory reference returns, for any combination."""
    matches = (
        ()
        if code is None
        else (PayloadMatch("Checked", "$.reason_codes", code), PayloadMatch("Planned", "$.action", code))
    )
    sqlite = _filled(SQLiteEventStore(tmp_path / f"{uuid.uuid4().hex}.db", synchronous="OFF"))
    try:
        assert _seqs(sqlite, payload=matches, **query) == _seqs(_filled(MemoryEventStore()), payload=matches, **query)
    finally:
        sqlite.close()
