"""Replay validates every recorded move against the machine's table, without callbacks."""

from __future__ import annotations

import json
import re
import sqlite3

import attrs
import orjson
import pytest
from conftest import Workspace, invoke

from lifecycle_fsm.candidate_events import HandoffDecided, StageFailed
from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import BaselineActivated, stream_of
from lifecycle_fsm.replay import load_state, verify
from lifecycle_fsm.store.chain import event_hash
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.upcasting import CURRENT_VERSIONS, UPCASTERS


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
        ready = HandoffDecided("ready_for_evaluation", "accept", [], [], {}, {}, {}, {}, {})
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


# --- every branch of the replay fold, on rows written behind the ledger's back ---------------


BASELINE_FIELDS = [a.name for a in attrs.fields(BaselineActivated)]
CHECKS = {
    "passed": False,
    "reason_codes": [],
    "freshness": {},
    "artifact": {},
    "rollback": {},
    "settings": {},
    "rules": {},
}


def _with_row(ws: Workspace, **row: object) -> int:
    """A real ledger (one DPO candidate) plus one raw row; returns the forged row's seq."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        head = ledger.store.head()
    values = {
        "seq": head.seq + 1,
        "stream_id": stream_of("dpo-v5"),
        "version": 2,
        "event_id": "forged",
        "type": "StageFailed",
        "schema_version": 1,
        "payload": '{"stage":"reward"}',
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "actor": "mallory",
        "prev_hash": head.hash,
        "hash": "0" * 64,
    } | row
    if "hash" not in row:  # a self-consistent row (it passes the per-row check): what replay must judge
        values["hash"] = event_hash(**{k: v for k, v in values.items() if k != "hash"})  # type: ignore[arg-type]
    with sqlite3.connect(ws.db, isolation_level=None) as conn:
        conn.execute(
            f"INSERT INTO events ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values())
        )
    return int(values["seq"])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"stream_id": "mystery"}, "unknown stream 'mystery'"),
        ({"payload": "not json"}, "payload is not JSON"),
        ({"payload": "[1, 2]"}, "payload is not an object"),
        ({"version": 5}, "jumps to version 5, expected 2"),
        ({"seq": 99}, "seq 99 follows seq"),
        ({"type": "CandidateTeleported"}, "unknown event type 'CandidateTeleported'"),
        ({"schema_version": 7}, "newer than this code knows"),
        (
            {"type": "ChecksRecorded", "payload": orjson.dumps({**CHECKS, "passed": "yes"}).decode()},
            "passed must be true or false",
        ),
        ({"type": "RecoveryPlanned", "payload": '{"blocking": false}'}, "missing ['action',"),
        ({"stream_id": "ledger", "version": 3, "type": "WindowAdvanced", "payload": "{}"}, "does not match its schema"),
        ({"stream_id": "ledger", "version": 3}, "StageFailed does not belong on the ledger stream"),
        (
            {
                "stream_id": "ledger",
                "version": 3,
                "type": "BaselineActivated",
                "payload": orjson.dumps(dict.fromkeys(BASELINE_FIELDS, 5)).decode(),
            },
            "policy_version must be a string",
        ),
        (
            {
                "stream_id": "candidate:new",
                "version": 1,
                "type": "CandidateReceived",
                "payload": orjson.dumps(
                    {
                        "candidate_id": "new",
                        "revision": 0,
                        "manifest_path": "m",
                        "manifest_sha256": "x",
                        "candidate": "not an object",
                        "artifact_at_receipt": None,
                        "registered": False,
                    }
                ).decode(),
            },
            "payload is unreadable",
        ),
        ({"type": "WindowAdvanced"}, "WindowAdvanced does not belong on a candidate stream"),
    ],
)
def test_replay_fold_names_the_corrupt_row(ws: Workspace, row: dict[str, object], message: str) -> None:
    """Whatever is wrong with a row, a full replay stops at it with a CorruptionError naming it."""
    bad_seq = _with_row(ws, **row)
    with ws.ledger() as ledger, pytest.raises(CorruptionError, match=re.escape(message)) as info:
        load_state(ledger.store, use_checkpoints=False)
    assert info.value.seq == bad_seq


def test_replay_upcasts_an_old_schema_row(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row at an older schema version goes through its upcaster on the replay hot path."""
    _with_row(ws, payload='{"failed_stage":"reward"}')  # StageFailed as a (pretend) v1 wrote it
    monkeypatch.setattr(StageFailed, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(CURRENT_VERSIONS, "StageFailed", 2)
    seen: list[dict[str, object]] = []

    def upcast_stagefailed_v1_v2(payload: dict[str, object]) -> dict[str, object]:
        seen.append(payload)
        return {"stage": payload["failed_stage"]}

    monkeypatch.setitem(UPCASTERS, ("StageFailed", 1), upcast_stagefailed_v1_v2)
    with ws.ledger() as ledger:
        state = load_state(ledger.store, use_checkpoints=False).state
        assert seen == [{"failed_stage": "reward"}]
        assert state.candidates["dpo-v5"].version == 2
        assert [type(e).__name__ for _, e in ledger.history("dpo-v5")] == ["CandidateReceived", "StageFailed"]
        assert ledger.history("dpo-v5")[1][1] == StageFailed("reward")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"reason":"superseded","kind":"prompt_queue"}', None),  # the right fields, not in sorted order
        ('{"reason":"superseded","kind":"prompt_queue","extra":1}', "unexpected ['extra']"),
        ('{"reason":"superseded"}', "missing ['kind']"),
    ],
)
def test_replay_judges_a_payload_by_its_fields_not_their_order(
    ws: Workspace, payload: str, message: str | None
) -> None:
    """The fast key check (the store's sorted order) falls back to the set of fields: any order folds, others fail."""
    bad_seq = _with_row(ws, type="TrustedStateInvalidated", payload=payload)
    with ws.ledger() as ledger:
        if message is None:
            state = load_state(ledger.store, use_checkpoints=False).state.candidates["dpo-v5"]
            assert (state.version, state.last_seq, state.decisive_seq) == (
                2,
                bad_seq,
                ledger.candidate("dpo-v5").decisive_seq,
            )
            return
        with pytest.raises(CorruptionError, match=re.escape(message)) as info:
            load_state(ledger.store, use_checkpoints=False)
        assert info.value.seq == bad_seq


# --- the readers beside the fold: explain, history, log, decisions export, diagram, report ----------


def _check_then_forged(ws: Workspace, edit: dict[str, object]) -> int:
    """dpo-v5 received and checked (verified), then a self-consistent ChecksRecorded row: the real check's
    payload with `edit` applied (None deletes the key). What a file writer who re-hashes can write."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.check("dpo-v5")
        head = ledger.store.head()
        checked = ledger.store.read_stream(stream_of("dpo-v5"))[-1]
    payload = {k: v for k, v in ({**orjson.loads(checked.payload), **edit}).items() if v is not None}
    values = {
        "seq": head.seq + 1,
        "stream_id": stream_of("dpo-v5"),
        "version": 3,
        "event_id": "forged",
        "type": "ChecksRecorded",
        "schema_version": checked.schema_version,
        "payload": orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode(),
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "actor": "mallory",
        "prev_hash": head.hash,
    }
    values["hash"] = event_hash(**values)  # type: ignore[arg-type]
    with sqlite3.connect(ws.db, isolation_level=None) as conn:
        conn.execute(
            f"INSERT INTO events ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values())
        )
    return int(values["seq"])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "edit",
    [
        {"passed": None, "reason_codes": None},  # keys missing: explain read `passed` before the fold judged it
        {"passed": "yes"},
        {"passed": False, "reason_codes": 5},
        {"settings": 5},  # the fold never reads it: explain's checks and the decision pool did
        {"artifact": 5},
        {"freshness": [1]},
    ],
    ids=["missing", "passed", "reason_codes", "settings", "artifact", "freshness"],
)
def test_every_reader_fails_closed_on_a_payload_of_the_wrong_shape(
    ws: Workspace, tmp_path: object, edit: dict[str, object]
) -> None:
    """A re-hashed ChecksRecorded row whose fields were missing or of the wrong type made `explain`, `history`,
    `log`, `decisions export`, `diagram ID` and `report` die with a KeyError / TypeError / ValueError /
    AttributeError traceback (exit 1). Each now exits 6 with one line naming the row's seq, as the fold does."""
    bad_seq = _check_then_forged(ws, edit)
    out = ws.root / "out"
    commands = [
        ["explain", "dpo-v5"],
        ["explain", "dpo-v5", "--format", "md"],
        ["--json", "explain", "dpo-v5"],
        ["history", "dpo-v5"],
        ["log"],
        ["log", "--reason", "artifact"],
        ["--json", "log"],
        ["decisions", "export", str(out / "pool")],
        ["diagram", "dpo-v5"],
        ["report", "--out", str(out / "r")],
    ]
    for args in commands:
        result = invoke(ws.db, *args)
        if result.exit_code == 0:  # a reader that never interprets the damaged field may show the row as stored
            continue
        assert result.exit_code == 6, (args, result.output)
        if args[0] != "report":  # the report is still written; it says the ledger did not verify
            assert result.stderr.startswith("Error: ") and f"seq {bad_seq}" in result.stderr, (args, result.stderr)
            assert result.stderr.count("\n") == 1, (args, result.stderr)


def test_a_decisions_export_that_fails_leaves_no_folder(ws: Workspace) -> None:
    """`decisions export DIR` made DIR before it read the log: a ledger it could not trust (exit 6) left an
    empty pool folder behind. The log is read first; a refused export creates nothing."""
    bad_seq = _check_then_forged(ws, {"passed": "yes"})
    pool = ws.root / "new" / "pool"
    result = invoke(ws.db, "decisions", "export", str(pool))
    assert result.exit_code == 6 and f"seq {bad_seq}" in result.stderr
    assert not pool.exists() and not pool.parent.exists()
