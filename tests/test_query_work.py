"""`streams.query_work` (what `lifecycle status ID` prints) is `StreamReader.query` without the attrs class.

The same state for every candidate of simulated ledgers (every state, revisions, recoveries,
checkpoints taken and garbled by the simulator), from a checkpoint copy and its tail as from
the whole stream, and the same errors.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import structlog
from conftest import Workspace

from lifecycle_fsm.cli.render import candidate_json, work_json
from lifecycle_fsm.errors import CorruptionError, NotFoundError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.ledger import utc_now
from lifecycle_fsm.state import CandidateState
from lifecycle_fsm.streams import StreamReader, query_work
from replay import take_checkpoint
from replay.drills.schedule import generate
from replay.drills.simulate import simulate
from store.open import open_store
from store.sqlite import SQLiteEventStore


def _same_everywhere(store: SQLiteEventStore) -> int:
    ids = [h.stream_id.removeprefix("candidate:") for h in store.streams() if h.stream_id.startswith("candidate:")]
    for cid in ids:
        state = StreamReader(store).query(cid)
        work = query_work(store, cid)
        assert CandidateState.from_work(work) == state, cid
        assert work_json(work) == candidate_json(state)
    return len(ids)


@pytest.mark.parametrize("seed", [3, 5])
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


def _life(ws: Workspace) -> None:
    queue = ws.root / "queue.jsonl"
    queue.write_text("{}\n")
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.record_trusted_state("dpo-v5", "prompt_queue", queue)
        ledger.fail_stage("dpo-v5", "sampling")
        take_checkpoint(ledger.store, clock=utc_now)
        ledger.complete_recovery("dpo-v5")
        ledger.check("dpo-v5")


def test_a_checkpoint_copy_plus_its_tail(ws: Workspace) -> None:
    _life(ws)
    store = open_store(str(ws.db), create=False)
    try:
        snap = store.latest_stream_snapshot(stream_of("dpo-v5"))
        assert snap is not None and snap.version < store.stream_version(stream_of("dpo-v5"))
        with structlog.testing.capture_logs() as logs:
            assert CandidateState.from_work(query_work(store, "dpo-v5")) == StreamReader(store).query("dpo-v5")
        assert not [e for e in logs if e["event"] == "stream_snapshot_skipped"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE checkpoint_streams SET state = replace(state, '\"recovering\"', '\"ready\"')",  # its sha256
        "UPDATE checkpoint_streams SET version = version + 1",  # the copy's own version
    ],
)
def test_an_untrusted_copy_is_skipped_by_both(ws: Workspace, edit: str) -> None:
    _life(ws)
    with sqlite3.connect(ws.db) as conn:
        conn.execute(edit)
    store = open_store(str(ws.db), create=False)
    try:
        with structlog.testing.capture_logs() as logs:
            work = query_work(store, "dpo-v5")
            state = StreamReader(store).query("dpo-v5")
        assert CandidateState.from_work(work) == state and state.state == "verified"
        skipped = [e["reason"] for e in logs if e["event"] == "stream_snapshot_skipped"]
        assert len(skipped) == 2 and skipped[0] == skipped[1]
    finally:
        store.close()


def test_the_same_errors(ws: Workspace) -> None:
    _life(ws)
    store = open_store(str(ws.db), create=False)
    try:
        with pytest.raises(NotFoundError) as theirs:
            StreamReader(store).query("nobody")
        with pytest.raises(NotFoundError) as ours:
            query_work(store, "nobody")
        assert str(ours.value) == str(theirs.value)
    finally:
        store.close()
    with sqlite3.connect(ws.db) as conn:  # a row edited in place, after the checkpoint
        conn.execute("DROP TRIGGER IF EXISTS events_refuse_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = (SELECT max(seq) FROM events)")
    store = open_store(str(ws.db), create=False)
    try:
        with pytest.raises(CorruptionError) as theirs:
            StreamReader(store).query("dpo-v5")
        with pytest.raises(CorruptionError) as ours:
            query_work(store, "dpo-v5")
        assert (str(ours.value), ours.value.seq) == (str(theirs.value), theirs.value.seq)
    finally:
        store.close()
