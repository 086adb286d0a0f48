"""`streams.query_work` (what `lifecycle status ID` prints) is `StreamReader.query` without the attrs class.

The same state for every candidate of simulated ledgers (every state, revisions, recoveries,
checkpoints taken and garbled by the simulator), from a checkpoint copy and its tail as from
the whole stream, and the same errors.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import structlog
from conftest import Workspace
from test_stream_snapshots import _history

from lifecycle_fsm.cli.render import candidate_json, work_json
from lifecycle_fsm.errors import CorruptionError, NotFoundError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.ledger import utc_now
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.replay.drills.schedule import generate
from lifecycle_fsm.replay.drills.simulate import simulate
from lifecycle_fsm.state import CandidateState
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.streams import StreamReader, query_work


def _same_everywhere(store: SQLiteEventStore) -> int:
    ids = [h.stream_id.removeprefix("candidate:") for h in store.streams() if h.stream_id.startswith("candidate:")]
    for cid in ids:
        state = StreamReader(store).query(cid)
        work = query_work(store, cid)
        assert CandidateState.from_work(work) == state, cid
        assert work_json(work) == candidate_json(state)
    return len(ids)


@pytest.mark.parametrize("seed", [2, 5])  # schedules without a final edited event
def test_every_candidate_of_a_simulated_ledger(tmp_path: Path, seed: int) -> None:
    result = simulate(generate(seed, 150, 6), keep=tmp_path)
    assert result.ok, result.failure
    store = SQLiteEventStore(tmp_path / f"simulated-seed-{seed}.db", synchronous="NORMAL")
    try:
        assert _same_everywhere(store) >= 4
        take_checkpoint(store, clock=utc_now)  # every stream now has a trusted copy at the head
        assert _same_everywhere(store) >= 4
    finally:
        store.close()


def _store(ws: Workspace) -> closing[EventStore]:
    return closing(open_store(str(ws.db), create=False))


def test_a_checkpoint_copy_plus_its_tail(ws: Workspace) -> None:
    _history(ws)  # a checkpoint, then events after it
    with _store(ws) as store:
        snap = store.latest_stream_snapshot(stream_of("dpo-v5"))
        assert snap is not None and snap.version < store.stream_version(stream_of("dpo-v5"))
        with structlog.testing.capture_logs() as logs:
            assert CandidateState.from_work(query_work(store, "dpo-v5")) == StreamReader(store).query("dpo-v5")
        assert not [e for e in logs if e["event"] == "stream_snapshot_skipped"]


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE checkpoint_streams SET state = replace(state, '\"recovering\"', '\"ready\"')",  # its sha256
        "UPDATE checkpoint_streams SET version = version + 1",  # the copy's own version
    ],
)
def test_an_untrusted_copy_is_skipped_by_both(ws: Workspace, edit: str) -> None:
    _history(ws)
    with sqlite3.connect(ws.db) as conn:
        conn.execute(edit)
    with _store(ws) as store, structlog.testing.capture_logs() as logs:
        work = query_work(store, "dpo-v5")
        state = StreamReader(store).query("dpo-v5")
    assert CandidateState.from_work(work) == state and state.state == "verified"
    skipped = [e["reason"] for e in logs if e["event"] == "stream_snapshot_skipped"]
    assert len(skipped) == 2 and skipped[0] == skipped[1]


@pytest.mark.parametrize("edited", [False, True])
def test_the_same_errors(ws: Workspace, edited: bool) -> None:
    """An unknown id (NotFoundError); a row edited in place after the checkpoint (CorruptionError, its seq)."""
    _history(ws)
    if edited:
        with sqlite3.connect(ws.db) as conn:
            conn.execute("DROP TRIGGER IF EXISTS events_refuse_update")
            conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = (SELECT max(seq) FROM events)")
    cid, error = ("dpo-v5", CorruptionError) if edited else ("nobody", NotFoundError)
    with _store(ws) as store:
        with pytest.raises(error) as theirs:
            StreamReader(store).query(cid)
        with pytest.raises(error) as ours:
            query_work(store, cid)
    assert (str(ours.value), getattr(ours.value, "seq", None)) == (
        str(theirs.value),
        getattr(theirs.value, "seq", None),
    )
