"""Events written before per-file digests (schema version 1) fold, verify and explain: "not recorded", never a guess."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import Workspace, invoke

from lifecycle_fsm.replay import load_state
from lifecycle_fsm.store.base import select_events
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.upcasting import (
    UPCASTERS,
    upcast_baseline_activated_v1_v2,
    upcast_candidate_received_v1_v2,
    upcast_checks_v1_v2,
)


def _v1(ws: Workspace) -> None:
    """A ledger as the previous release wrote it: the same events at version 1, without the new fields."""
    with ws.ledger(actor="old-release") as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.dpo())
        led.check("dpo-v5")
        led.hand_off("dpo-v5")
        rows = select_events(led.store)
        events = [(e.stream_id, e.type, json.loads(e.payload), e.recorded_at) for e in rows]
    old = ws.root / "old.db"
    store = SQLiteEventStore(old, synchronous="OFF")
    versions: dict[str, int] = {}
    for stream, type_name, payload, at in events:
        payload.pop("adapter_tree", None)
        payload.pop("artifact_at_receipt", None)
        for name in ("artifact", "rollback"):
            if isinstance(payload.get(name), dict):
                payload[name].pop("tree", None)
        v = versions.get(stream, 0)
        store.append(stream, v, [NewEvent(stream, type_name, 1, payload, uuid.uuid4().hex, at, "old-release")])
        versions[stream] = v + 1
    store.close()
    ws.db = old
    # Raw appends leave the state index unlabelled (the release's commands labelled it): rebuild it.
    assert invoke(ws.db, "replay", "--full").exit_code == 0


def test_a_version_1_ledger_verifies_and_explains_without_inventing_digests(ws: Workspace) -> None:
    """verify is ok, the state is the same, and explain says the per-file digests were not recorded."""
    _v1(ws)
    assert json.loads(invoke(ws.db, "verify", "--json").stdout)["ok"] is True
    doc = json.loads(invoke(ws.db, "explain", "dpo-v5", "--json").stdout)
    assert doc["state"] == "ready"
    assert doc["artifact"]["at_receipt"] is None
    assert doc["artifact"]["files"]["compared"] is False and "recorded before" in doc["artifact"]["files"]["note"]
    assert doc["rollback"]["files"]["compared"] is False
    text = invoke(ws.db, "explain", "dpo-v5").stdout
    assert "files: not compared (no per-file digests recorded" in text
    received = json.loads(invoke(ws.db, "history", "dpo-v5", "--json").stdout)[0]["payload"]
    assert received["artifact_at_receipt"] is None


def test_a_version_1_ledger_replays_to_the_state_its_commands_fold(ws: Workspace) -> None:
    """Replay keeps a check's and a hand-off's stored text and parses it once at the end:
    upcast there too, so the kept payloads equal the command side's (decoded row by row)."""
    _v1(ws)
    with ws.ledger() as led:
        replayed = load_state(led.store, use_checkpoints=False).state.candidates["dpo-v5"]
        live = led.candidate("dpo-v5")
        seqs = {e.type: e.seq for e in select_events(led.store)}
    assert replayed == live
    assert replayed.last_check is not None and replayed.last_handoff is not None
    assert replayed.last_check["seq"] == seqs["ChecksRecorded"]
    assert replayed.last_handoff["seq"] == seqs["HandoffDecided"]
    for kept in (replayed.last_check, replayed.last_handoff):
        assert kept["artifact"]["tree"] is None and kept["artifact"]["reused_from"] is None


@pytest.mark.parametrize(
    ("type_name", "payload", "expected"),
    [
        ("BaselineActivated", {"policy_version": "p"}, {"policy_version": "p", "adapter_tree": None}),
        ("CandidateReceived", {"candidate_id": "c"}, {"candidate_id": "c", "artifact_at_receipt": None}),
        ("ChecksRecorded", {"artifact": {"actual": "a"}, "rollback": {"actual": "b"}},
         {"artifact": {"actual": "a", "tree": None}, "rollback": {"actual": "b", "tree": None}}),
        ("HandoffDecided", {"artifact": {"actual": "a"}, "rollback": "junk"},
         {"artifact": {"actual": "a", "tree": None}, "rollback": "junk"}),
    ],
)  # fmt: skip
def test_named_upcasters_add_none_and_leave_the_input_alone(
    type_name: str, payload: dict[str, Any], expected: dict[str, Any]
) -> None:
    """Each v1 -> v2 upcaster adds the new field as None (not recorded) and never mutates the stored dict."""
    before = json.loads(json.dumps(payload))
    assert UPCASTERS[(type_name, 1)](payload) == expected
    assert payload == before
    assert UPCASTERS[(type_name, 1)] in (
        upcast_baseline_activated_v1_v2, upcast_candidate_received_v1_v2, upcast_checks_v1_v2,
    )  # fmt: skip
