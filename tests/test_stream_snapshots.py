"""One candidate is read from the latest checkpoint plus its tail, never trusted blindly."""

from __future__ import annotations

import hashlib
import sqlite3

import structlog
from conftest import Workspace, run_cli

from lifecycle_fsm.events import stream_of
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.streams import fold_candidate


def _history(ws: Workspace) -> None:
    """A DPO candidate with a long-ish life: checks, trusted states, a recovery, a hand-off."""
    queue = ws.root / "queue.jsonl"
    queue.write_text("{}\n")
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        for _ in range(5):
            ledger.record_trusted_state("dpo-v5", "prompt_queue", queue)
        ledger.fail_stage("dpo-v5", "sampling")
        take_checkpoint(ledger.store, clock=utc_now)
        ledger.complete_recovery("dpo-v5")
        ledger.check("dpo-v5")


def _full_fold(ws: Workspace) -> object:
    with ws.ledger() as ledger:
        return fold_candidate(ledger.store.read_stream(stream_of("dpo-v5")))


def test_candidate_from_checkpoint_plus_tail_equals_full_fold(ws: Workspace) -> None:
    """A fresh Ledger reads the candidate from its stream snapshot + tail: same state as a full fold."""
    _history(ws)
    with ws.ledger() as ledger, structlog.testing.capture_logs() as logs:
        snap = ledger.store.latest_stream_snapshot(stream_of("dpo-v5"))
        assert snap is not None and snap.version < ledger.store.stream_version(stream_of("dpo-v5"))
        state = ledger.candidate("dpo-v5")
    assert state == _full_fold(ws)
    assert state.state == "verified"
    assert not [e for e in logs if e["event"] == "stream_snapshot_skipped"]


def test_corrupt_stream_snapshot_is_skipped_and_said(ws: Workspace) -> None:
    """An edited stream snapshot fails its sha256: skipped with a warning, the stream is folded instead."""
    _history(ws)
    with sqlite3.connect(ws.db) as conn:
        conn.execute("UPDATE checkpoint_streams SET state = replace(state, '\"recovering\"', '\"ready\"')")
    with ws.ledger() as ledger, structlog.testing.capture_logs() as logs:
        state = ledger.candidate("dpo-v5")
    assert state == _full_fold(ws)
    skipped = [e for e in logs if e["event"] == "stream_snapshot_skipped"]
    assert skipped and "sha256" in skipped[0]["reason"]


def test_forged_stream_snapshot_with_matching_digest_is_caught_by_head_hash(ws: Workspace) -> None:
    """Rewriting the log under a checkpoint breaks the head hash it recorded: the snapshot is not used."""
    _history(ws)
    with sqlite3.connect(ws.db) as conn:
        conn.execute("UPDATE checkpoints SET head_hash = ?", ("f" * 64,))
    with ws.ledger() as ledger, structlog.testing.capture_logs() as logs:
        assert ledger.candidate("dpo-v5") == _full_fold(ws)
    assert any("head hash" in e.get("reason", "") for e in logs if e["event"] == "stream_snapshot_skipped")


def test_ledger_without_checkpoint_reads_whole_stream(ws: Workspace) -> None:
    """No checkpoint: nothing to skip, the stream is folded from its first event."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
    with Ledger.open(ws.db, synchronous="NORMAL") as ledger:
        assert ledger.store.latest_stream_snapshot(stream_of("dpo-v5")) is None
        assert ledger.candidate("dpo-v5").version == 1


def test_verify_compares_stream_copies_with_a_full_replay(ws: Workspace) -> None:
    """A stream copy forged together with its digest passes the read-time checks but not `verify`."""
    import hashlib

    from lifecycle_fsm.replay import verify

    _history(ws)
    with sqlite3.connect(ws.db) as conn:
        (state,) = conn.execute("SELECT state FROM checkpoint_streams").fetchone()
        forged = state.replace('"recovering"', '"ready"')
        digest = hashlib.sha256(forged.encode()).hexdigest()
        conn.execute("UPDATE checkpoint_streams SET state = ?, state_sha256 = ?", (forged, digest))
    with ws.ledger() as ledger:
        report = verify(ledger.store)
    assert report["ok"] is False
    assert "stream copies differ" in report["reason"]


def test_a_stream_copy_that_is_not_an_object_is_skipped_and_said(ws: Workspace) -> None:
    """A copy rewritten as a JSON string with its digest recomputed: not read as a state (no ValueError
    traceback, in the library or from `lifecycle status ID`): skipped and said, the stream folded instead."""
    _history(ws)
    text = '"ab"'
    with sqlite3.connect(ws.db) as conn:
        conn.execute(
            "UPDATE checkpoint_streams SET state = ?, state_sha256 = ?",
            (text, hashlib.sha256(text.encode()).hexdigest()),
        )
    with ws.ledger() as ledger, structlog.testing.capture_logs() as logs:
        assert ledger.candidate("dpo-v5") == _full_fold(ws)
    skipped = [e for e in logs if e["event"] == "stream_snapshot_skipped"]
    assert skipped and "cannot be read" in skipped[0]["reason"]
    done = run_cli(str(ws.db), "--json", "status", "dpo-v5")
    assert done.returncode == 0, done.stderr
    assert '"state":"verified"' in done.stdout.replace(" ", "")
