"""Replay validates every recorded move against the machine's table, without callbacks."""

from __future__ import annotations

import json

import pytest
from conftest import Workspace, invoke

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import HandoffDecided, stream_of
from replay import load_state, verify
from store.records import NewEvent


def _forge(ledger_store: object, stream_id: str, version: int, event: HandoffDecided) -> None:
    """Append a well-chained event that the Ledger itself would never write."""
    new = NewEvent(
        stream_id, event.TYPE, event.SCHEMA_VERSION, event.to_payload(), "forged-1", "2026-01-01T00:00:00Z", "x"
    )
    ledger_store.append(stream_id, version, [new])  # type: ignore[attr-defined]


def _rejected(ws: Workspace) -> int:
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo(source_policy_version="an-old-baseline"))
        assert ledger.check("dpo-v5").state == "reject"
        ready = HandoffDecided("ready_for_evaluation", "accept", [], [], {}, {}, {}, {})
        _forge(ledger.store, stream_of("dpo-v5"), ledger.candidate("dpo-v5").version, ready)
        return ledger.store.head().seq


def test_illegal_sequence_is_reported_structurally(ws: Workspace) -> None:
    """reject -> ready in the log: replay names the seq, the state, what was found and what is allowed."""
    bad_seq = _rejected(ws)
    with ws.ledger() as ledger:
        with pytest.raises(CorruptionError) as info:
            load_state(ledger.store, use_checkpoints=False)
        assert info.value.seq == bad_seq
        assert info.value.details["state"] == "reject"
        assert info.value.details["found"] == "hand_off_ready"
        assert info.value.details["allowed"] == []
        report = verify(ledger.store)
    assert report["ok"] is False
    assert report["bad_seq"] == bad_seq
    assert report["events"] == bad_seq  # the chain itself holds: the forgery was appended, not edited


def test_cli_verify_and_replay_fail_closed_on_illegal_sequence(ws: Workspace) -> None:
    """`verify` exits 6 naming the seq; `replay` and `status` refuse rather than guess."""
    bad_seq = _rejected(ws)
    result = invoke(ws.db, "--json", "verify")
    assert result.exit_code == 6
    assert json.loads(result.stdout)["bad_seq"] == bad_seq
    for args in (["replay"], ["status"]):
        out = invoke(ws.db, *args)
        assert out.exit_code == 6
        assert out.stderr.startswith(f"Error: seq {bad_seq}: HandoffDecided (hand_off_ready) is not allowed")
