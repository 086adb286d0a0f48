"""Edges a reviewer found: corrupt rows, forged checkpoint copies, odd manifests, retries, usage errors."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import orjson
import pytest
from conftest import Workspace, count_events, invoke, run_cli

from lifecycle_fsm.candidate_events import ChecksRecorded
from lifecycle_fsm.errors import CorruptionError, IllegalCommandError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.store.records import NewEvent


def test_non_string_kind_is_received_and_rejected_not_a_crash(ws: Workspace) -> None:
    """A list as candidate_kind is a semantic problem: received, then rejected with candidate_kind."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo("odd", candidate_kind=["dpo"]))
        result = ledger.check("odd")
    assert result.state == "reject"
    assert "candidate_kind" in result.candidate.reason_codes  # type: ignore[union-attr]
    assert invoke(ws.db, "replay", "--full").exit_code == 0


def test_corrupt_payload_on_the_live_path_is_an_integrity_error(ws: Workspace) -> None:
    """A well-chained event whose payload lacks a field: status/check say corruption (exit 6), no traceback."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        payload = ChecksRecorded(True, [], {}, {}, {}, {}, {}).to_payload()
        del payload["reason_codes"]
        bad = NewEvent(stream_of("dpo-v5"), "ChecksRecorded", 1, payload, "bad-1", utc_now(), "x")
        ledger.store.append(stream_of("dpo-v5"), 1, [bad])
    for args in (["status", "dpo-v5"], ["check", "dpo-v5"], ["explain", "dpo-v5"]):
        result = invoke(ws.db, *args)
        assert result.exit_code == 6, args
        assert result.stderr.startswith(
            "Error: seq 4: ChecksRecorded payload does not match its schema (missing ['reason_codes']"
        )
    with ws.ledger() as ledger, pytest.raises(CorruptionError):
        ledger.candidate("dpo-v5")


def test_commands_never_decide_from_a_checkpoint_copy(ws: Workspace) -> None:
    """A copy forged with a matching digest may answer a query, but a command folds the log and refuses."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo(source_policy_version="old"))
        assert ledger.check("dpo-v5").state == "reject"
        take_checkpoint(ledger.store, clock=utc_now)
    with sqlite3.connect(ws.db) as conn:
        (state,) = conn.execute("SELECT state FROM checkpoint_streams").fetchone()
        forged = state.replace('"state":"reject"', '"state":"verified"')
        conn.execute(
            "UPDATE checkpoint_streams SET state = ?, state_sha256 = ?",
            (forged, hashlib.sha256(forged.encode()).hexdigest()),
        )
    before = count_events(ws.db)
    with ws.ledger() as ledger, pytest.raises(IllegalCommandError):
        ledger.hand_off("dpo-v5")
    assert count_events(ws.db) == before
    assert invoke(ws.db, "verify").exit_code == 6  # and verify names the forgery


def test_a_different_manifest_file_is_not_a_retry(ws: Workspace) -> None:
    """Same fields, different bytes: refused for a verified candidate, a revision for a tune one."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        manifest = ws.dpo()
        ledger.receive(manifest)
        ledger.check("dpo-v5")
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "notes": "reformatted by a tool"}))
        with pytest.raises(IllegalCommandError):
            ledger.receive(manifest)
        tuned = ws.grpo(decision="tune")
        ledger.receive(tuned)
        ledger.check("grpo-v7")
        assert ledger.hand_off("grpo-v7").state == "tune"
        tuned.write_text(tuned.read_text() + "\n")
        revised = ledger.receive(tuned)
    assert revised.candidate is not None
    assert (revised.candidate.state, revised.candidate.revision) == ("received", 1)


@pytest.mark.parametrize("version", ["", "dpo-v6\n", "dpo-v9\t", "dpo\u200bv5"])
def test_empty_policy_version_is_received_under_its_path(ws: Workspace, version: str) -> None:
    """No usable policy_version (empty, or with a control or format character that would print like
    another): the candidate is received under its manifest path, then rejected."""
    manifest = ws.dpo(policy_version=version)
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline())).exit_code == 0
    out = invoke(ws.db, "--json", "receive", str(manifest))
    assert out.exit_code == 0
    cid = json.loads(out.stdout)["id"]
    assert cid.endswith("manifest.json")
    checked = json.loads(invoke(ws.db, "--json", "check", cid).stdout)
    assert checked["state"] == "reject" and "candidate_identity" in checked["reason_codes"]


def test_fail_retry_reports_the_plan_it_recorded(ws: Workspace) -> None:
    """A retried `fail --event-id` prints its original plan, even after later failures."""
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline())).exit_code == 0
    assert invoke(ws.db, "receive", str(ws.grpo())).exit_code == 0
    first = json.loads(invoke(ws.db, "--json", "fail", "grpo-v7", "--stage", "sampling", "--event-id", "E1").stdout)
    assert invoke(ws.db, "recovered", "grpo-v7").exit_code == 0
    assert invoke(ws.db, "fail", "grpo-v7", "--stage", "update").exit_code == 0
    again = json.loads(invoke(ws.db, "--json", "fail", "grpo-v7", "--stage", "sampling", "--event-id", "E1").stdout)
    assert (again["stage"], again["action"], again["events"]) == ("sampling", "rebuild_prompt_queue", first["events"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["window", "abc"], "Invalid value for 'N'"),
        (["fail", "x"], "Missing option '--stage'"),
        (["bogus"], "No such command 'bogus'"),
    ],
)
def test_usage_errors_are_one_line(ws: Workspace, args: list[str], needle: str) -> None:
    """click's usage errors follow the same form: one `Error:` line, exit 2, nothing on stdout."""
    result = run_cli(ws.db, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0]


def test_recorded_evidence_is_plain_json(ws: Workspace) -> None:
    """Every payload in the file is plain JSON an auditor can read without this library."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.check("dpo-v5")
    with sqlite3.connect(ws.db) as conn:
        payloads = [orjson.loads(p) for (p,) in conn.execute("SELECT payload FROM events")]
    assert payloads[-1]["artifact"]["expected"] == payloads[-1]["artifact"]["actual"]


def test_a_re_plan_becomes_the_decisive_event(ws: Workspace) -> None:
    """A recovering candidate that fails again is explained by its latest plan, not its first."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.grpo())
        first = ledger.fail_stage("grpo-v7", "sampling")
        second = ledger.fail_stage("grpo-v7", "reward")
    assert second.candidate is not None and first.candidate is not None
    assert second.candidate.decisive_seq == second.events[-1].seq != first.candidate.decisive_seq
    doc = json.loads(invoke(ws.db, "--json", "explain", "grpo-v7").stdout)
    assert doc["decisive_event"]["evidence"]["stage"] == "reward"
