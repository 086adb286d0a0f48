"""`verify` reads the log once: the fold takes the rows the chain walk has just checked (issue #13).

Every backend, real rows: checkpoints that fall inside a fetched batch, and a forged row
that both breaks the chain and trips the fold (the chain break stays the finding).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backends import Backend

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import take_checkpoint, verify
from lifecycle_fsm.store.base import EventStore, event_at
from lifecycle_fsm.store.chain import event_hash

CLOCK = "2026-12-01T00:00:00.000000Z"
EVENTS = 300  # past one SQLite batch (256 rows): checkpoints fall inside batches


@pytest.fixture
def store(backend: Backend) -> Iterator[EventStore]:
    opened = backend.open()
    ledger = Ledger(opened, actor="test", clock=lambda: CLOCK)
    ledger.init()
    for window in range(2, EVENTS + 1):
        ledger.advance_window(window)
        if window in (100, 290):
            take_checkpoint(opened, clock=lambda: CLOCK)
    yield opened
    opened.close()


def test_checkpoints_inside_batches_are_each_compared_and_no_row_is_lost(store: EventStore) -> None:
    report = verify(store)
    assert report["ok"] is True, report
    assert report["events"] == store.count_events() == EVENTS
    assert sorted((c["position"], c["status"]) for c in report["checkpoints"]) == [(100, "ok"), (290, "ok")]


def test_a_broken_chain_is_the_finding_even_where_the_fold_fails_first(backend: Backend, store: EventStore) -> None:
    """Seq 200 rewritten with a payload the fold refuses and its own hash recomputed: the
    fold fails at 200, but the chain breaks at 201, and that is what verify reports (as when
    the chain was walked before folding)."""
    row = event_at(store, 200)
    assert row is not None
    forged = event_hash(
        prev_hash=row.prev_hash,
        seq=row.seq,
        stream_id=row.stream_id,
        version=row.version,
        event_id=row.event_id,
        type=row.type,
        schema_version=row.schema_version,
        payload="[]",
        recorded_at=row.recorded_at,
        actor=row.actor,
    )
    backend.tamper(200, "payload", "[]")
    backend.tamper(200, "hash", forged)
    report = verify(store)
    assert (report["ok"], report["bad_seq"]) == (False, 201), report
    assert report["reason"] == "prev_hash does not match the previous event's hash"
    assert report["events"] == EVENTS
