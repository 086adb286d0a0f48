"""Version and identity fields of the wrong type fail their checks (SPEC §3, §6, §7).

The seed's versions are strings (`sft-v1`, `dpo-v1`, `pref-eval-v1`, `math-v1`) and its
window numbers integers. Its rules test `bool(value)`, so `true`, `1` or `{"k": 0}` passed
as a version and a candidate claiming them reached `ready`. A wrongly typed version is a
semantic problem in a well-formed manifest: like an empty version or a non-integer window
index (SPEC §6, §7), the candidate is received and its check rejects it with the reason
code of the field, so an auditor sees it (and `audit` still writes its records).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lifecycle_fsm import State
from lifecycle_fsm.rules import check_candidate_freshness
from tests.conftest import Workspace, cli

DPO = {
    "candidate_kind": "dpo",
    "source_policy_version": "sft-v1",
    "policy_version": "dpo-v1",
    "evaluation_version": "pref-eval-v1",
    "preference_evidence_version": "pref-train-v1",
}
GRPO = {**DPO, "candidate_kind": "grpo", "verifier_version": "math-v1", "window_age": 0}
WRONG = [True, False, 1, 0, 1.5, {"k": 0}, ["v1"], "", "   "]


@pytest.mark.parametrize("value", WRONG)
@pytest.mark.parametrize(
    ("field", "check"), [("policy_version", "candidate_identity"), ("evaluation_version", "evaluation_identity")]
)
def test_a_common_identity_must_be_a_non_empty_string(field: str, check: str, value: Any) -> None:
    result = check_candidate_freshness({**DPO, field: value}, "sft-v1", 2)
    assert not result["fresh"]
    assert result["failed_checks"] == [check]


@pytest.mark.parametrize("value", WRONG)
def test_branch_identities_must_be_non_empty_strings(value: Any) -> None:
    dpo = check_candidate_freshness({**DPO, "preference_evidence_version": value}, "sft-v1", 2)
    assert dpo["failed_checks"] == ["branch_evidence"]
    grpo = check_candidate_freshness({**GRPO, "verifier_version": value}, "sft-v1", 2)
    assert grpo["failed_checks"] == ["branch_evidence"]


@pytest.mark.parametrize("value", [True, 1, {"k": 0}])
def test_a_source_policy_that_is_not_the_active_string_fails(value: Any) -> None:
    assert check_candidate_freshness({**DPO, "source_policy_version": value}, "sft-v1", 2)["failed_checks"] == [
        "source_policy"
    ]


def test_string_versions_still_pass() -> None:
    assert check_candidate_freshness(DPO, "sft-v1", 2) == {"fresh": True, "failed_checks": []}
    assert check_candidate_freshness(GRPO, "sft-v1", 2) == {"fresh": True, "failed_checks": []}


def test_the_testers_dpo_manifest_is_rejected_not_ready(ws: Workspace) -> None:
    """receive (with --id), check, handoff: used to end `ready`; now the check rejects it with each
    field's reason code, the hand-off is refused (reject is terminal) and explain shows the JSON values."""
    baseline = ws.baseline()
    manifest = ws.dpo("dpo-typed", policy_version=True, evaluation_version=True, preference_evidence_version={"k": 0})
    assert cli(ws.db, "init").returncode == 0
    assert cli(ws.db, "baseline", "activate", str(baseline)).returncode == 0
    received = cli(ws.db, "--json", "receive", str(manifest), "--id", "typed")
    assert received.returncode == 0, received.stderr
    assert orjson.loads(received.stdout)["state"] == "received"  # received, so an auditor sees it
    checked = cli(ws.db, "--json", "check", "typed")
    assert checked.returncode == 0, checked.stderr
    doc = orjson.loads(checked.stdout)
    assert doc["state"] == "reject"
    assert doc["reason_codes"] == ["candidate_identity", "evaluation_identity", "branch_evidence"]
    handoff = cli(ws.db, "handoff", "typed")
    assert handoff.returncode == 5 and "reject is terminal" in handoff.stderr
    explained = cli(ws.db, "explain", "typed")
    assert explained.returncode == 0, explained.stderr
    assert "policy_version: true" in explained.stdout
    assert "candidate_identity: FAILED; claimed true; checked against a non-empty version string" in explained.stdout
    assert 'preference_evidence_version={"k":0}' in explained.stdout
    explained_json = orjson.loads(cli(ws.db, "--json", "explain", "typed").stdout)
    assert explained_json["state"] == "reject"
    assert explained_json["reason_codes"] == ["candidate_identity", "evaluation_identity", "branch_evidence"]


def test_a_grpo_verifier_version_that_is_a_number_fails_branch_evidence(ws: Workspace) -> None:
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.grpo("grpo-typed", trajectory_identity={"verifier_version": 7}))
        checked = ledger.check("grpo-typed")
    assert checked.candidate.state == State.REJECT
    assert list(checked.candidate.reason_codes) == ["branch_evidence"]
