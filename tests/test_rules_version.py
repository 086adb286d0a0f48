"""The decision rules' declared version stays honest: a digest of what they decide, recomputed here."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import orjson
import pytest
from conftest import Workspace

from lifecycle_fsm.rules import (
    CANDIDATE_KINDS,
    RECOVERY_STATES_BY_STAGE,
    RULES,
    UPSTREAM_DECISIONS,
    check_candidate_freshness,
    choose_recovery_action,
    decide_lifecycle_handoff,
)

ACTIVE = "a" * 64


def behaviour() -> list[Any]:
    """What the three rules decide over a fixed grid of inputs, valid and not."""
    out: list[Any] = []
    for kind, semantic_id, source, version, evaluation, preference, verifier, age in itertools.product(
        (*CANDIDATE_KINDS, "ppo", None),
        ("PT-DPO-OFFLINE", "PT-GRPO-GROUPWISE", "PT-OTHER", None),
        (ACTIVE, "b" * 64, None),
        ("v1", " ", "v1\n", None, 3),
        ("e1", "", None),
        ("p1", None),
        ("m1", None),
        (-1, 0, 2, 3, None, True),
    ):
        candidate = {
            "candidate_kind": kind,
            "semantic_id": semantic_id,
            "source_policy_version": source,
            "policy_version": version,
            "evaluation_version": evaluation,
            "preference_evidence_version": preference,
            "verifier_version": verifier,
            "window_age": age,
        }
        out.append(check_candidate_freshness(candidate, ACTIVE, 2))
    for stage, kinds in RECOVERY_STATES_BY_STAGE.items():
        for present in itertools.product((True, False), repeat=len(kinds)):
            out.append(choose_recovery_action({"stage": stage, "available": dict(zip(kinds, present, strict=True))}))
    for upstream, fresh, rollback, artifact in itertools.product(
        (*UPSTREAM_DECISIONS, "maybe", None), (True, False), (True, False), (True, False)
    ):
        freshness = {"fresh": fresh, "failed_checks": [] if fresh else ["source_policy"]}
        out.append(
            decide_lifecycle_handoff(upstream, freshness, {"rollback_ready": rollback, "artifact_verified": artifact})
        )
    return out


def test_the_declared_rules_version_matches_what_the_rules_decide() -> None:
    digest = hashlib.sha256(orjson.dumps(behaviour(), option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert RULES["digest"] == digest, (
        "the decision rules decide differently now: bump RULES['version'] in lifecycle_fsm/rules.py and set "
        f"RULES['digest'] to {digest!r} (decisions recorded under the old rules will be flagged)"
    )


def test_a_hand_off_decides_under_todays_rules_after_a_check_under_other_rules(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision made under old rules stays in the history; the hand-off re-checks and records
    today's rules, and the candidate is then no longer flagged."""
    from lifecycle_fsm import decisions
    from lifecycle_fsm.store.chain import canonical_json

    with ws.ledger() as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        monkeypatch.setattr(decisions, "RULES", {"version": 0, "digest": "0" * 64})
        checked = ledger.check("dpo-v5")
        monkeypatch.undo()
        handed = ledger.hand_off("dpo-v5")
        assert handed.state == "ready" and [e.type for e in handed.events] == ["HandoffDecided"]
        recorded = [orjson.loads(e.payload)["rules"] for e in (*checked.events, *handed.events)]
        assert recorded == [{"version": 0, "digest": "0" * 64}, RULES]
        assert ledger.explain("dpo-v5").stale_rules is None
        assert canonical_json(ledger.candidate("dpo-v5").last_handoff["rules"]) == canonical_json(RULES)
