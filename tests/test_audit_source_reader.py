"""The audit's records read by a reader written against the source workflow's own records.

`source_reader` transcribes what that workflow's reader and hand-off step read, key by key:
the candidate list and each record's `handoff_status` and `semantic_id` (which candidates go
to evaluation), the hand-off's `candidate_records` and `recovery_scenarios`, and the meaning of
each record key the audit step writes (`path`, `upstream_decision`, `freshness`, `artifact`,
`evidence`, `hard_failures`): re-deciding a record from its own keys with the workflow's
hand-off rule gives the status it records. Real ledgers, real adapters, real records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Workspace
from test_audit import records, run_audit, tamper

from lifecycle_fsm import audit
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger


def _workflow_handoff(upstream_decision: Any, freshness: JSON, evidence: JSON) -> JSON:
    """The workflow's hand-off rule, in its own terms: three hard checks, then the upstream decision."""
    hard_checks = {
        "freshness": freshness["fresh"],
        "rollback": evidence["rollback_ready"],
        "artifact": evidence["artifact_verified"],
    }
    hard_failures = [name for name, passed in hard_checks.items() if not passed]
    if upstream_decision not in {"accept", "tune", "reject"}:
        hard_failures.append("upstream_state")
    elif upstream_decision == "reject":
        hard_failures.append("upstream_reject")
    status = "reject" if hard_failures else "tune" if upstream_decision == "tune" else "ready_for_evaluation"
    return {"handoff_status": status, "hard_failures": hard_failures}


def source_reader(evidence_path: Path, handoff_path: Path) -> JSON:
    """Read both records only through the workflow's keys; fail (KeyError, assert) where they differ."""
    record = json.loads(evidence_path.read_text(encoding="utf-8"))
    ready = [item for item in record["candidate_records"] if item["handoff_status"] == "ready_for_evaluation"]
    statuses = {item["semantic_id"]: item["handoff_status"] for item in record["candidate_records"]}
    for item in record["candidate_records"]:
        assert isinstance(item["path"], str) and item["path"]
        assert set(item["artifact"]) >= {"path", "sha256"}  # the manifest's adapter entry
        evidence = item["evidence"]
        for check, verdict, expected in (
            ("artifact_check", "artifact_verified", item["artifact"]["sha256"]),
            ("rollback_check", "rollback_ready", record["active_policy_version"]),
        ):
            compared = evidence[check]
            assert compared["expected"] == expected
            assert evidence[verdict] is (bool(compared["expected"]) and compared["actual"] == compared["expected"])
        if item["handoff_status"] in ("ready_for_evaluation", "tune", "reject"):
            again = _workflow_handoff(item["upstream_decision"], item["freshness"], evidence)
            assert again == {"handoff_status": item["handoff_status"], "hard_failures": item["hard_failures"]}
            assert item["freshness"]["fresh"] is not bool(item["freshness"]["failed_checks"])
    for scenario in record["recovery_scenarios"]:
        assert set(scenario) >= {"stage", "required_state", "reused_state", "action"}
    handoff = json.loads(handoff_path.read_text(encoding="utf-8"))
    assert handoff["handoff_status"] == ("ready" if ready else "no_ready_candidate")
    assert handoff["candidate_records"] == record["candidate_records"]
    assert handoff["recovery_scenarios"] == record["recovery_scenarios"]
    return {"ready_for_evaluation": [item["semantic_id"] for item in ready], "candidate_status": statuses}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path, paths_from_root=True)


def _paths(ws: Workspace, label: str) -> tuple[Path, Path]:
    out = ws.root / "results"
    return out / f"lifecycle_evidence_{label}.json", out / f"lifecycle_handoff_{label}.json"


def test_the_workflow_reader_reads_ready_tune_and_rejected_candidates(ws: Workspace) -> None:
    ws.baseline()
    dpo, grpo = ws.dpo(), ws.grpo()
    assert run_audit(ws, dpo, grpo, label="ready").exit_code == 0
    read = source_reader(*_paths(ws, "ready"))
    assert read == {
        "ready_for_evaluation": ["PT-DPO-OFFLINE", "PT-GRPO-GROUPWISE"],
        "candidate_status": {"PT-DPO-OFFLINE": "ready_for_evaluation", "PT-GRPO-GROUPWISE": "ready_for_evaluation"},
    }
    tuned, stale = ws.dpo("dpo-v6", decision="tune"), ws.grpo("grpo-v8")
    tamper(ws.root / "grpo-v8" / "adapter")
    assert run_audit(ws, tuned, stale, label="mixed", extra=("--active-window", "4")).exit_code == 0
    read = source_reader(*_paths(ws, "mixed"))
    assert read["candidate_status"] == {"PT-DPO-OFFLINE": "tune", "PT-GRPO-GROUPWISE": "reject"}
    evidence, _ = records(ws, "mixed")
    grpo_record = evidence["candidate_records"][1]
    assert grpo_record["hard_failures"] == ["freshness", "artifact"]
    assert grpo_record["freshness"] == {"fresh": False, "failed_checks": ["branch_evidence"]}


def test_an_unreadable_artifact_root_records_inconclusive(tmp_path: Path) -> None:
    """The artifact root gone between the plan and the run (an unmounted volume): the candidate's
    record says `inconclusive`, nothing failed, nothing is ready, and the workflow's reader reads it."""
    volume = Workspace(tmp_path / "volume", paths_from_root=True)
    volume.root.mkdir()
    manifests = tmp_path / "manifests"
    baseline = volume.baseline()
    dpo = volume.dpo()
    for made in (baseline, dpo):  # the manifests live off the volume; their adapter paths lead onto it
        (manifests / made.parent.name).mkdir(parents=True)
        made.rename(manifests / made.parent.name / made.name)
    request = audit.AuditRequest(
        baseline=manifests / "sft" / "manifest.json",
        candidates=(manifests / "dpo-v5" / "manifest.json",),
        label="gone",
        out=tmp_path / "results",
        root=volume.root,
    )
    prepared = audit.prepare(request)
    volume.root.rename(tmp_path / "unmounted")
    with Ledger.open(tmp_path / "ledger.db", synchronous="NORMAL", artifact_root=volume.root) as ledger:
        result = audit.run(prepared, ledger)
        assert ledger.candidate("dpo-v5").state == "received"  # nothing was decided
    record = result.evidence["candidate_records"][0]
    assert (record["handoff_status"], record["hard_failures"]) == ("inconclusive", [])
    assert record["inconclusive"] == ["artifact", "rollback"] and record["ledger_state"] == "received"
    assert record["evidence"]["artifact_verified"] is False and record["evidence"]["artifact_check"]["actual"] is None
    assert [e["type"] for e in record["ledger_events"]] == ["CandidateReceived", "InconclusiveCheckRecorded"]
    assert result.handoff_status == "no_ready_candidate"
    read = source_reader(result.evidence_path, result.handoff_path)
    assert read == {"ready_for_evaluation": [], "candidate_status": {"PT-DPO-OFFLINE": "inconclusive"}}


def test_the_audit_refuses_a_ledger_opened_with_another_root(ws: Workspace, tmp_path: Path) -> None:
    """One rule for relative paths: the ledger the audit drives must read them under the audit's root."""
    ws.baseline()
    request = audit.AuditRequest(
        baseline=ws.root / "sft" / "manifest.json",
        candidates=(ws.dpo(),),
        label="x",
        out=ws.root / "results",
        root=ws.root,
    )
    with Ledger.open(ws.db, synchronous="NORMAL") as ledger:
        with pytest.raises(InputError, match="artifact root"):
            audit.run(audit.prepare(request), ledger)
        assert ledger.store.head().seq == 0
