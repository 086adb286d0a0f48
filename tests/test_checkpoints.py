"""Checkpoints: checkpoint + tail equals a full replay; untrusted snapshots are skipped, and say why."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest
import structlog
from conftest import Workspace, invoke

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import load_state, snapshot_json, take_checkpoint, verify
from lifecycle_fsm.replay.checkpoints import FINGERPRINT_PARTS
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import CheckpointRecord


def clock() -> str:
    return "2024-06-01T00:00:00.000000Z"


def full(ledger: Ledger, to: int | None = None) -> str:
    """The canonical snapshot of a full replay (no checkpoints) up to `to`."""
    return snapshot_json(load_state(ledger.store, to=to, use_checkpoints=False).state)


def loaded(ledger: Ledger, to: int | None = None) -> str:
    return snapshot_json(load_state(ledger.store, to=to).state)


def sql(db: Path, statement: str, *params: object) -> None:
    """Run one statement on a plain sqlite3 connection (not our code)."""
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(statement, params)


@pytest.fixture
def busy(ws: Workspace, ledger: Ledger) -> Ledger:
    """A ledger with settings, a ready DPO candidate and a GRPO candidate in recovery (10 events)."""
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    ledger.receive(ws.grpo())
    ledger.check("dpo-v5")
    ledger.check("grpo-v7")
    ledger.hand_off("dpo-v5")
    ledger.fail_stage("grpo-v7", "update")
    assert ledger.store.head().seq == 9
    return ledger


def more_events(ws: Workspace, ledger: Ledger) -> None:
    """A tail after the checkpoint: recovery completes, a new candidate arrives, the window moves."""
    ledger.complete_recovery("grpo-v7")
    ledger.receive(ws.dpo("dpo-v6"))
    ledger.check("dpo-v6")
    ledger.advance_window(2)


def test_checkpoint_then_load_equals_full_replay(busy: Ledger) -> None:
    """Right after take_checkpoint, loading starts from it and equals a full replay."""
    record = take_checkpoint(busy.store, clock=clock)
    assert record.position == 9
    result = load_state(busy.store)
    assert result.checkpoint == record
    assert result.skipped == ()
    assert snapshot_json(result.state) == full(busy) == record.snapshot


def test_checkpoint_plus_tail_equals_full_replay(ws: Workspace, busy: Ledger) -> None:
    """Events after a checkpoint are folded onto it, giving exactly the full replay."""
    record = take_checkpoint(busy.store, clock=clock)
    more_events(ws, busy)
    result = load_state(busy.store)
    assert result.checkpoint is not None
    assert result.checkpoint.position == record.position == 9
    assert result.state.position == busy.store.head().seq > 9
    assert snapshot_json(result.state) == full(busy)
    assert result.state.candidates["grpo-v7"].state == "received"


def test_load_to_every_position_equals_full_replay(ws: Workspace, busy: Ledger) -> None:
    """load_state(to=N) equals a full replay to N for every N, with a checkpoint in the middle."""
    record = take_checkpoint(busy.store, to=5, clock=clock)
    more_events(ws, busy)
    for n in range(busy.store.head().seq + 1):
        result = load_state(busy.store, to=n)
        assert snapshot_json(result.state) == full(busy, to=n), n
        assert result.state.position == n
        expected_start = record.position if n >= record.position else None
        assert (None if result.checkpoint is None else result.checkpoint.position) == expected_start
        assert result.skipped == ()


def test_corrupt_snapshot_is_skipped_and_logged(ws: Workspace, busy: Ledger) -> None:
    """A snapshot that no longer matches its sha256 is skipped, named with why, and logged."""
    older = take_checkpoint(busy.store, to=5, clock=clock)
    latest = take_checkpoint(busy.store, clock=clock)
    more_events(ws, busy)
    sql(ws.db, "UPDATE checkpoints SET snapshot = snapshot || ' ' WHERE checkpoint_id = ?", latest.checkpoint_id)
    with structlog.testing.capture_logs() as logs:
        result = load_state(busy.store)
    assert [cid for cid, _ in result.skipped] == [latest.checkpoint_id]
    reason = result.skipped[0][1]
    assert "sha256" in reason and "corrupt" in reason
    assert result.checkpoint is not None and result.checkpoint.checkpoint_id == older.checkpoint_id
    assert snapshot_json(result.state) == full(busy)
    skipped_logs = [e for e in logs if e["event"] == "checkpoint_skipped"]
    assert len(skipped_logs) == 1
    assert skipped_logs[0]["log_level"] == "warning"
    assert skipped_logs[0]["checkpoint_id"] == latest.checkpoint_id
    assert skipped_logs[0]["reason"] == reason
    statuses = {c["checkpoint_id"]: c["status"] for c in verify(busy.store)["checkpoints"]}
    assert statuses == {older.checkpoint_id: "ok", latest.checkpoint_id: "broken"}  # corrupt, not merely stale


def test_only_checkpoint_corrupt_falls_back_to_full_replay(ws: Workspace, busy: Ledger) -> None:
    """With its one checkpoint corrupt, loading is a full replay from the beginning."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoints SET snapshot = '{}' WHERE checkpoint_id = ?", record.checkpoint_id)
    result = load_state(busy.store)
    assert result.checkpoint is None
    assert [cid for cid, _ in result.skipped] == [record.checkpoint_id]
    assert snapshot_json(result.state) == full(busy)


def _fingerprint_with(part: str) -> str:
    return canonical_json({**FINGERPRINT_PARTS, part: "0" * 64})


@pytest.mark.parametrize(
    ("column", "value", "named"),
    [
        ("fingerprint", _fingerprint_with("machine"), "machine"),
        ("fingerprint", _fingerprint_with("fold"), "fold"),
        ("fingerprint", "not json at all", "unreadable fingerprint"),
        ("schema_version", 99, "schema version 99"),
    ],
)
def test_stale_checkpoint_is_skipped_and_reported_stale(
    ws: Workspace, busy: Ledger, column: str, value: object, named: str
) -> None:
    """A checkpoint built by other code is not used (the reason names what changed); verify calls it stale."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, f"UPDATE checkpoints SET {column} = ? WHERE checkpoint_id = ?", value, record.checkpoint_id)
    result = load_state(busy.store)
    assert result.checkpoint is None
    assert len(result.skipped) == 1 and named in result.skipped[0][1]
    assert snapshot_json(result.state) == full(busy)
    report = verify(busy.store)
    assert report["ok"] is True
    assert [(c["checkpoint_id"], c["status"]) for c in report["checkpoints"]] == [(record.checkpoint_id, "stale")]
    assert named in report["checkpoints"][0]["reason"]


def test_wrong_head_hash_is_skipped(ws: Workspace, busy: Ledger) -> None:
    """A checkpoint whose head hash is not the log's hash at its position is not trusted."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoints SET head_hash = ? WHERE checkpoint_id = ?", "f" * 64, record.checkpoint_id)
    result = load_state(busy.store)
    assert result.checkpoint is None
    assert len(result.skipped) == 1 and "head hash" in result.skipped[0][1]
    assert snapshot_json(result.state) == full(busy)
    report = verify(busy.store)
    assert report["ok"] is False
    assert report["checkpoints"][0]["status"] == "broken"


@pytest.mark.parametrize("fingerprint", [_fingerprint_with("rules"), canonical_json(FINGERPRINT_PARTS)])
def test_a_checkpoint_built_under_other_rules_is_used_with_a_warning(
    ws: Workspace, busy: Ledger, fingerprint: str
) -> None:
    """Rules decide what comes next, not what recorded events fold to: a checkpoint built under other
    rules loads (a warning names them); one from before rules were recorded loads without one."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoints SET fingerprint = ? WHERE checkpoint_id = ?", fingerprint, record.checkpoint_id)
    with structlog.testing.capture_logs() as logs:
        result = load_state(busy.store)
        again = Ledger(busy.store).candidate("dpo-v5")
    assert result.checkpoint is not None and result.checkpoint.checkpoint_id == record.checkpoint_id
    assert result.skipped == () and snapshot_json(result.state) == full(busy) and again.state == "ready"
    warned = [e for e in logs if e["event"] == "checkpoint_other_rules"]
    other = "rules" in orjson.loads(fingerprint)
    assert [e["rules"] for e in warned] == (["0" * 64] if other else [])
    assert not [e for e in logs if e["event"] in ("checkpoint_skipped", "stream_snapshot_skipped")]
    assert verify(busy.store)["ok"] is True


def test_verify_names_the_first_broken_checkpoint_and_lists_both(ws: Workspace, busy: Ledger) -> None:
    """Two broken checkpoints, the later one taken first (a higher id at a lower position): `bad_seq`
    and `reason` are the lower position's, and `problems` lists both in position order."""
    late = take_checkpoint(busy.store, clock=clock)
    early = take_checkpoint(busy.store, to=4, clock=clock)
    assert early.checkpoint_id > late.checkpoint_id and early.position < late.position
    for record in (late, early):
        sql(ws.db, "UPDATE checkpoints SET head_hash = ? WHERE checkpoint_id = ?", "f" * 64, record.checkpoint_id)
    report = verify(busy.store)
    assert report["ok"] is False and report["bad_seq"] == early.position == 4
    assert report["reason"].startswith(f"checkpoint {early.checkpoint_id}: ")
    assert [(p["code"], p["bad_seq"]) for p in report["problems"]] == [("checkpoint", 4), ("checkpoint", 9)]


def test_checkpoint_past_the_head_is_skipped(ws: Workspace, busy: Ledger) -> None:
    """A checkpoint claiming a position the log does not have is not trusted."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoints SET position = 500 WHERE checkpoint_id = ?", record.checkpoint_id)
    result = load_state(busy.store)
    assert result.checkpoint is None
    assert "past the log's head" in result.skipped[0][1]
    assert snapshot_json(result.state) == full(busy)
    report = verify(busy.store)
    assert report["ok"] is False and report["checkpoints"][0]["status"] == "broken"


def _forge(ws: Workspace, record: CheckpointRecord) -> str:
    """Rewrite a snapshot (dpo-v5 becomes reject) and its sha256 to match: only a replay can tell."""
    data = orjson.loads(record.snapshot)
    data["candidates"]["dpo-v5"]["state"] = "reject"
    forged = canonical_json(data)
    digest = hashlib.sha256(forged.encode()).hexdigest()
    sql(
        ws.db,
        "UPDATE checkpoints SET snapshot = ?, snapshot_sha256 = ? WHERE checkpoint_id = ?",
        forged,
        digest,
        record.checkpoint_id,
    )
    return forged


def test_verify_catches_a_forged_snapshot(ws: Workspace, busy: Ledger) -> None:
    """A snapshot edited with a matching sha256 is 'broken' in verify: it differs from a full replay."""
    good = take_checkpoint(busy.store, to=4, clock=clock)
    bad = take_checkpoint(busy.store, clock=clock)
    _forge(ws, bad)
    report = verify(busy.store)
    assert report["ok"] is False
    statuses = {c["checkpoint_id"]: c["status"] for c in report["checkpoints"]}
    assert statuses == {good.checkpoint_id: "ok", bad.checkpoint_id: "broken"}
    broken = next(c for c in report["checkpoints"] if c["status"] == "broken")
    assert "differs from a full replay" in broken["reason"]
    assert str(bad.checkpoint_id) in report["reason"]
    assert report["bad_seq"] == bad.position  # SPEC §6: the first bad position, the checkpoint's (was null)


def test_a_broken_chain_leaves_checkpoints_not_checked(ws: Workspace, busy: Ledger) -> None:
    """`verify --json` keeps its documented shape on the ledgers an auditor cares about: `checkpoints` is
    null (not checked: a snapshot is compared with a replay of rows the chain no longer vouches for),
    never absent (a tool reading it crashed) nor a fake `[]`."""
    take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "DROP TRIGGER events_refuse_update")
    sql(ws.db, "UPDATE events SET actor = 'mallory' WHERE seq = 3")
    report = verify(busy.store)
    assert report["ok"] is False and report["bad_seq"] == 3
    assert "checkpoints" in report and report["checkpoints"] is None


def test_verify_ok_with_good_checkpoints(ws: Workspace, busy: Ledger) -> None:
    """verify passes a good log with several good checkpoints."""
    take_checkpoint(busy.store, to=3, clock=clock)
    take_checkpoint(busy.store, clock=clock)
    more_events(ws, busy)
    take_checkpoint(busy.store, clock=clock)
    report = verify(busy.store)
    assert report["ok"] is True
    assert [c["status"] for c in report["checkpoints"]] == ["ok", "ok", "ok"]


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_verify_reports_tampered_event(ws: Workspace, busy: Ledger) -> None:
    """`verify --json` exits 6 and names the edited seq after a payload edit behind the triggers."""
    sql(ws.db, "DROP TRIGGER events_refuse_update")
    sql(ws.db, "UPDATE events SET payload = json_set(payload, '$.tampered', 1) WHERE seq = 7")
    result = invoke(ws.db, "verify", "--json")
    assert result.exit_code == 6
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["bad_seq"] == 7
    assert report["reason"]


def test_cli_verify_ok(ws: Workspace, busy: Ledger) -> None:
    """`verify --json` exits 0 on an untouched ledger with a checkpoint."""
    take_checkpoint(busy.store, clock=clock)
    result = invoke(ws.db, "--json", "verify")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["events"] == 9


def test_cli_replay_reports_checkpoint_position(ws: Workspace, busy: Ledger) -> None:
    """`replay --json` starts from the checkpoint; `replay --full --json` from the beginning, same states."""
    made = invoke(ws.db, "checkpoint", "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["position"] == 9
    more_events(ws, busy)
    quick = invoke(ws.db, "replay", "--json")
    assert quick.exit_code == 0, quick.output
    quick_doc = json.loads(quick.stdout)
    assert quick_doc["checkpoint"] == 9
    slow = invoke(ws.db, "replay", "--full", "--json")
    assert slow.exit_code == 0, slow.output
    slow_doc = json.loads(slow.stdout)
    assert slow_doc["checkpoint"] is None
    assert quick_doc["states"] == slow_doc["states"]
    assert {s["id"]: s["state"] for s in slow_doc["states"]} == {
        "dpo-v5": "ready",
        "dpo-v6": "verified",
        "grpo-v7": "received",
    }


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("checkpoints", "snapshot", None),
        ("checkpoints", "snapshot", b"\xff\x00"),
        ("checkpoints", "snapshot_sha256", b"\x01"),
        ("checkpoint_streams", "state", b"\xff\x00"),
    ],
    ids=["snapshot-null", "snapshot-blob", "sha-blob", "stream-state-blob"],
)
def test_a_snapshot_that_is_not_text_is_a_broken_checkpoint_not_a_traceback(
    ws: Workspace, busy: Ledger, table: str, column: str, value: object
) -> None:
    """A checkpoint's snapshot (or a stream copy) set to NULL or a BLOB with the sqlite3 shell made `status`,
    `status ID`, `replay`, `verify` and `checkpoint` die with "AttributeError: 'NoneType' / 'bytes' object has
    no attribute 'encode'" (exit 1). The checkpoint is skipped as corrupt (verify: broken, exit 6) and every
    read answers from the log."""
    take_checkpoint(busy.store, clock=clock)
    expected = full(busy)
    sql(ws.db, f"UPDATE {table} SET {column} = ?", value)
    assert snapshot_json(load_state(busy.store).state) == expected
    for args in (["status"], ["status", "dpo-v5"], ["replay"], ["checkpoint"]):
        result = invoke(ws.db, *args)
        assert result.exit_code == 0, (args, result.output)
    result = invoke(ws.db, "verify", "--json")
    assert result.exit_code == 6, result.output
    assert "broken" in {c["status"] for c in json.loads(result.stdout)["checkpoints"]}


@pytest.mark.parametrize("digest", ["0" * 64, b"\x01"], ids=["wrong", "blob"])
def test_verify_reports_a_stream_copy_whose_digest_does_not_hold(ws: Workspace, busy: Ledger, digest: object) -> None:
    """`status ID` skips a checkpoint's stream copy whose state_sha256 does not match its state (corrupt), but
    `verify` compared only the states and called that checkpoint ok (exit 0). It is broken, naming the stream."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoint_streams SET state_sha256 = ? WHERE stream_id = 'candidate:dpo-v5'", digest)
    report = verify(busy.store)
    assert report["ok"] is False
    [checkpoint] = report["checkpoints"]
    assert checkpoint["checkpoint_id"] == record.checkpoint_id and checkpoint["status"] == "broken"
    assert "candidate:dpo-v5" in checkpoint["reason"] and "sha256" in checkpoint["reason"]
    assert invoke(ws.db, "verify").exit_code == 6


@pytest.mark.parametrize("position", ["abc", None, 1e20], ids=["text", "null", "huge"])
def test_a_checkpoint_whose_position_is_no_seq_is_broken_not_hidden(
    ws: Workspace, busy: Ledger, position: object
) -> None:
    """A checkpoint row whose `position` was set by hand to text, NULL or a number past any seq was left out of
    every checkpoint query (`WHERE position <= …`): `verify` listed no checkpoint and said ok (exit 0) with a
    damaged row in the file. It is listed, broken (exit 6), and loading skips it as before."""
    record = take_checkpoint(busy.store, clock=clock)
    sql(ws.db, "UPDATE checkpoints SET position = ? WHERE checkpoint_id = ?", position, record.checkpoint_id)
    sound = take_checkpoint(busy.store, to=5, clock=clock)  # an older sound one beside it: mixed positions
    report = verify(busy.store)
    assert report["ok"] is False and report["bad_seq"] is None  # no seq to name: the row holds none
    statuses = {c["checkpoint_id"]: (c["status"], c["position"]) for c in report["checkpoints"]}
    assert statuses == {record.checkpoint_id: ("broken", None), sound.checkpoint_id: ("ok", 5)}
    assert "is not a seq" in report["reason"]
    assert snapshot_json(load_state(busy.store).state) == full(busy)
    assert invoke(ws.db, "verify").exit_code == 6 and invoke(ws.db, "status").exit_code == 0


def _walked_in_order(conn: sqlite3.Connection) -> bool:
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM checkpoints WHERE position <= 9 ORDER BY position DESC, checkpoint_id DESC"
    ).fetchall()
    return "TEMP B-TREE" not in " ".join(str(row) for row in plan)


def test_a_load_walks_checkpoints_newest_first_by_an_index(ws: Workspace) -> None:
    """Sorting every checkpoint with its snapshot made each load, and so each checkpoint, cost as much
    as all before it. A ledger without the index (made before it, or dropped by hand) gets it from its
    next writer."""
    with Ledger.open(ws.db) as ledger:
        ledger.init()
        take_checkpoint(ledger.store, clock=lambda: "2026-01-01T00:00:00.000000Z")
    with closing(sqlite3.connect(ws.db)) as conn:
        assert _walked_in_order(conn)
        conn.execute("DROP INDEX checkpoints_position")
    with closing(sqlite3.connect(ws.db)) as conn:  # a new connection: the old one keeps its planned statement
        assert not _walked_in_order(conn)
    Ledger.open(ws.db).close()
    with closing(sqlite3.connect(ws.db)) as conn:
        assert _walked_in_order(conn)


@pytest.mark.postgres
def test_on_postgres_the_checkpoints_index_is_made_by_the_next_writer(pg_url: str) -> None:
    from backends import pg_execute

    Ledger.open(pg_url).close()
    pg_execute(pg_url, "DROP INDEX checkpoints_position")
    assert pg_execute(pg_url, "SELECT to_regclass('checkpoints_position')") == [(None,)]
    Ledger.open(pg_url).close()
    assert pg_execute(pg_url, "SELECT to_regclass('checkpoints_position') IS NOT NULL") == [(True,)]


def test_a_checkpoint_from_a_checkpoint_keeps_the_seals_streams_version(ws: Workspace) -> None:
    """A seal folds to no state but its stream's version: a snapshot without it made the next checkpoint,
    started from it, drop `seals` from the state index, and `verify` fail on a sound ledger."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with Ledger.open(ws.db, signing_key=pem) as ledger:
        ledger.init()
        ledger.seal()
        take_checkpoint(ledger.store, clock=clock)
        ledger.advance_window(2)
        record = take_checkpoint(ledger.store, clock=clock)
        assert load_state(ledger.store).state.streams == {"seals": 1}
        assert record.snapshot == full(ledger)
        report = verify(ledger.store)
        assert report["ok"] is True, report
