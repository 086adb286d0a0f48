"""Tests for the seed's three pure decisions (SPEC §3, seed 000 Step 4)."""

from __future__ import annotations

from typing import Any

import pytest

from lifecycle_fsm.checks import window_age
from lifecycle_fsm.rules import (
    FRESHNESS_CHECKS,
    check_candidate_freshness,
    choose_recovery_action,
    decide_lifecycle_handoff,
)

ACTIVE = "sft-v1"
MAX_AGE = 2

DPO: dict[str, Any] = {
    "candidate_kind": "dpo",
    "decision": "accept",
    "source_policy_version": ACTIVE,
    "policy_version": "dpo-v1",
    "evaluation_version": "pref-eval-v1",
    "preference_evidence_version": "pref-train-v1",
    "window_age": 99,
}
ONLINE: dict[str, Any] = {**DPO, "candidate_kind": "grpo", "verifier_version": "math-v1", "window_age": 2}
GOOD_EVIDENCE = {"rollback_ready": True, "artifact_verified": True}


def fresh(candidate: dict[str, Any], active: str = ACTIVE, max_age: int = MAX_AGE) -> dict[str, Any]:
    """Shorthand for the freshness check with the seed's settings."""
    return check_candidate_freshness(candidate, active, max_age)


# --- the seed's own Step 4 cases, restated ----------------------------------------------


def test_seed_freshness_cases() -> None:
    """The seed's freshness cases: lineage, DPO evidence, online window and verifier, kind, evaluation."""
    assert fresh(DPO)["fresh"]
    assert fresh({**DPO, "decision": "tune"})["fresh"]
    assert not fresh({**DPO, "source_policy_version": "sft-v0"})["fresh"]
    assert not fresh({**DPO, "preference_evidence_version": ""})["fresh"]
    assert fresh(ONLINE)["fresh"]
    assert not fresh({**ONLINE, "window_age": 3})["fresh"]
    assert not fresh({**ONLINE, "verifier_version": ""})["fresh"]
    assert not fresh({**DPO, "candidate_kind": "unknown"})["fresh"]
    assert not fresh({**DPO, "evaluation_version": ""})["fresh"]


def test_seed_recovery_cases() -> None:
    """The seed's recovery cases: each stage's nearest state, reward's fallback to the queue, no state."""
    sampling = choose_recovery_action({"stage": "sampling", "available": {"prompt_queue": True}})
    assert sampling["action"] == "retry_sampling_from_prompt_queue"
    reward = choose_recovery_action({"stage": "reward", "available": {"trajectories": True}})
    assert reward["action"] == "resume_reward_from_saved_trajectories"
    assert reward["recovery_state"] == "trajectories" and reward["reused_state"]
    update = choose_recovery_action({"stage": "update", "available": {"pre_update_checkpoint": True}})
    assert update["action"] == "restore_pre_update_checkpoint"
    artifact = choose_recovery_action({"stage": "artifact_validation", "available": {"verified_baseline": True}})
    assert artifact["action"] == "rollback_to_verified_baseline"
    fallback = choose_recovery_action({"stage": "reward", "available": {"trajectories": False, "prompt_queue": True}})
    assert fallback["recovery_state"] == "prompt_queue"
    assert fallback["action"] == "restart_sampling_from_prompt_queue"
    assert choose_recovery_action({"stage": "reward", "available": {}})["action"] == "restart_sampling"


def test_seed_handoff_cases() -> None:
    """The seed's hand-off cases: accept, tune, upstream reject, stale evidence, missing rollback."""
    ok = {"fresh": True}
    assert decide_lifecycle_handoff("accept", ok, GOOD_EVIDENCE)["handoff_status"] == "ready_for_evaluation"
    assert decide_lifecycle_handoff("tune", ok, GOOD_EVIDENCE)["handoff_status"] == "tune"
    rejected = decide_lifecycle_handoff("reject", ok, GOOD_EVIDENCE)
    assert rejected["handoff_status"] == "reject" and "upstream_reject" in rejected["hard_failures"]
    assert decide_lifecycle_handoff("accept", {"fresh": False}, GOOD_EVIDENCE)["handoff_status"] == "reject"
    no_rollback = {**GOOD_EVIDENCE, "rollback_ready": False}
    assert decide_lifecycle_handoff("accept", ok, no_rollback)["handoff_status"] == "reject"


# --- recovery: SPEC §3's whole table -------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "available", "state", "action"),
    [
        ("sampling", {"prompt_queue": True}, "prompt_queue", "retry_sampling_from_prompt_queue"),
        ("sampling", {}, None, "rebuild_prompt_queue"),
        ("sampling", {"prompt_queue": False}, None, "rebuild_prompt_queue"),
        ("reward", {"trajectories": True}, "trajectories", "resume_reward_from_saved_trajectories"),
        (
            "reward",
            {"trajectories": True, "prompt_queue": True},
            "trajectories",
            "resume_reward_from_saved_trajectories",
        ),
        ("reward", {"trajectories": False, "prompt_queue": True}, "prompt_queue", "restart_sampling_from_prompt_queue"),
        ("reward", {"prompt_queue": True}, "prompt_queue", "restart_sampling_from_prompt_queue"),
        ("reward", {}, None, "restart_sampling"),
        ("update", {"pre_update_checkpoint": True}, "pre_update_checkpoint", "restore_pre_update_checkpoint"),
        (
            "update",
            {"pre_update_checkpoint": True, "verified_baseline": True},
            "pre_update_checkpoint",
            "restore_pre_update_checkpoint",
        ),
        ("update", {"verified_baseline": True}, "verified_baseline", "rollback_to_verified_baseline"),
        (
            "update",
            {"pre_update_checkpoint": False, "verified_baseline": True},
            "verified_baseline",
            "rollback_to_verified_baseline",
        ),
        ("update", {}, None, "block_update"),
        ("artifact_validation", {"verified_baseline": True}, "verified_baseline", "rollback_to_verified_baseline"),
        ("artifact_validation", {}, None, "block_release"),
    ],
)
def test_recovery_table(stage: str, available: dict[str, bool], state: str | None, action: str) -> None:
    """Each row of SPEC §3: the nearest available trusted state and its action, else the stage's fallback."""
    plan = choose_recovery_action({"stage": stage, "available": available})
    assert plan == {"stage": stage, "recovery_state": state, "reused_state": state is not None, "action": action}


@pytest.mark.parametrize(
    ("stage", "fallback"),
    [
        ("sampling", "rebuild_prompt_queue"),
        ("reward", "restart_sampling"),
        ("update", "block_update"),
        ("artifact_validation", "block_release"),
    ],
)
def test_recovery_ignores_states_the_stage_cannot_use(stage: str, fallback: str) -> None:
    """Trusted states outside a stage's own list never satisfy it."""
    usable = {
        "sampling": {"prompt_queue"},
        "reward": {"trajectories", "prompt_queue"},
        "update": {"pre_update_checkpoint", "verified_baseline"},
        "artifact_validation": {"verified_baseline"},
    }[stage]
    others = {kind: True for kind in ("prompt_queue", "trajectories", "pre_update_checkpoint", "verified_baseline")}
    available = {kind: ok for kind, ok in others.items() if kind not in usable}
    plan = choose_recovery_action({"stage": stage, "available": available})
    assert plan["action"] == fallback
    assert plan["recovery_state"] is None and plan["reused_state"] is False


@pytest.mark.parametrize("stage", ["training", "", "Sampling"])
def test_unknown_stage_is_a_value_error_naming_it(stage: str) -> None:
    """An unknown failure stage raises ValueError whose message names the stage."""
    with pytest.raises(ValueError, match=repr(stage)):
        choose_recovery_action({"stage": stage, "available": {"prompt_queue": True}})


# --- freshness ------------------------------------------------------------------------


def test_every_failed_check_is_named_in_order() -> None:
    """A candidate wrong in every way fails all five checks, in SPEC §3's order."""
    bad = {"candidate_kind": "ppo", "source_policy_version": "sft-v0", "policy_version": "", "evaluation_version": None}
    assert fresh(bad) == {
        "fresh": False,
        "failed_checks": [
            "candidate_kind",
            "source_policy",
            "candidate_identity",
            "evaluation_identity",
            "branch_evidence",
        ],
    }


def test_a_ledger_evaluation_version_is_named_in_the_rules_order() -> None:
    """A candidate naming another evaluation than the ledger's fails `evaluation_identity` where the
    rule puts it: before `branch_evidence`, after the lineage checks, not appended at the end."""
    from lifecycle_fsm.checks import freshness
    from lifecycle_fsm.state import LedgerSettings

    settings = LedgerSettings(baseline={"policy_version": "sft-v0"}, evaluation_version="eval-v2", max_window_age=2)
    stale = {**ONLINE, "window_age": 9}  # branch evidence too old; its evaluation version is pref-eval-v1
    assert freshness(stale, settings) == {
        "fresh": False,
        "failed_checks": ["source_policy", "evaluation_identity", "branch_evidence"],
    }


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"source_policy_version": "sft-v0"}, "source_policy"),
        ({"source_policy_version": None}, "source_policy"),
        ({"policy_version": ""}, "candidate_identity"),
        ({"policy_version": None}, "candidate_identity"),
        ({"policy_version": "dpo-v6\n"}, "candidate_identity"),
        ({"evaluation_version": ""}, "evaluation_identity"),
        ({"evaluation_version": None}, "evaluation_identity"),
        ({"preference_evidence_version": ""}, "branch_evidence"),
        ({"preference_evidence_version": None}, "branch_evidence"),
    ],
)
def test_one_broken_identity_names_exactly_that_check(change: dict[str, Any], failed: str) -> None:
    """Breaking one identity of a fresh DPO candidate fails exactly that named check."""
    assert fresh({**DPO, **change}) == {"fresh": False, "failed_checks": [failed]}


@pytest.mark.parametrize("kind", ["ppo", "DPO", "", None])
def test_unknown_kind_fails_candidate_kind(kind: Any) -> None:
    """An unknown kind fails candidate_kind; its branch evidence is judged by the online rule."""
    assert fresh({**ONLINE, "candidate_kind": kind}) == {"fresh": False, "failed_checks": ["candidate_kind"]}
    assert fresh({**DPO, "candidate_kind": kind})["failed_checks"] == ["candidate_kind", "branch_evidence"]


@pytest.mark.parametrize(
    ("kind", "semantic_id", "holds"),
    [
        ("dpo", "PT-GRPO-GROUPWISE", False),
        ("grpo", "PT-DPO-OFFLINE", False),
        ("rlvr", "PT-DPO-OFFLINE", False),
        ("rlvr", "PT-GRPO-GROUPWISE", True),
        ("dpo", "PT-DPO-OFFLINE", True),
        ("dpo", "PT-SOMETHING-ELSE", True),
        ("grpo", None, True),
    ],
)
def test_a_kind_must_agree_with_its_semantic_id(kind: str, semantic_id: str | None, holds: bool) -> None:
    """An explicit kind may refine the semantic id (grpo to rlvr), never cross offline and online."""
    candidate = {**(DPO if kind == "dpo" else ONLINE), "candidate_kind": kind, "semantic_id": semantic_id}
    assert fresh(candidate)["failed_checks"] == ([] if holds else ["candidate_kind"])


def test_missing_keys_fail_their_checks() -> None:
    """Absent identity fields count as empty: an empty candidate fails every check."""
    assert fresh({})["failed_checks"] == [
        "candidate_kind",
        "source_policy",
        "candidate_identity",
        "evaluation_identity",
        "branch_evidence",
    ]


def test_no_active_baseline_fails_source_policy() -> None:
    """With no active policy version, even a candidate naming an empty source is not fresh."""
    assert fresh({**DPO, "source_policy_version": ""}, active="")["failed_checks"] == ["source_policy"]


def test_upstream_decision_is_not_freshness() -> None:
    """An upstream reject (or no decision at all) does not change freshness."""
    assert fresh({**DPO, "decision": "reject"})["fresh"]
    assert fresh({key: value for key, value in ONLINE.items() if key != "decision"})["fresh"]


@pytest.mark.parametrize("kind", ["grpo", "rlvr"])
@pytest.mark.parametrize(
    ("window_age", "ok"),
    [(0, True), (1, True), (MAX_AGE, True), (MAX_AGE + 1, False), (-1, False), (-100, False)],
)
def test_online_window_age_bounds(kind: str, window_age: int, ok: bool) -> None:
    """Online evidence is fresh only for an age in [0, maximum]; a negative age is not fresh."""
    result = fresh({**ONLINE, "candidate_kind": kind, "window_age": window_age})
    assert result == {"fresh": ok, "failed_checks": [] if ok else ["branch_evidence"]}


@pytest.mark.parametrize("kind", ["grpo", "rlvr"])
@pytest.mark.parametrize("window_age", [True, False, "1", "0", 1.0, None, [1]])
def test_online_window_age_must_be_an_int(kind: str, window_age: Any) -> None:
    """A bool, string, float, null or list window age fails branch_evidence (never coerced)."""
    result = fresh({**ONLINE, "candidate_kind": kind, "window_age": window_age})
    assert result == {"fresh": False, "failed_checks": ["branch_evidence"]}


@pytest.mark.parametrize("kind", ["grpo", "rlvr"])
def test_online_missing_window_age_fails(kind: str) -> None:
    """An online candidate without a window age fails branch_evidence (no default age)."""
    candidate = {key: value for key, value in ONLINE.items() if key != "window_age"}
    assert fresh({**candidate, "candidate_kind": kind})["failed_checks"] == ["branch_evidence"]


@pytest.mark.parametrize("kind", ["grpo", "rlvr"])
@pytest.mark.parametrize("verifier", ["", None, "<missing>"])
def test_online_needs_a_verifier_version(kind: str, verifier: Any) -> None:
    """An online candidate without a verifier version fails branch_evidence, even in its window."""
    candidate = {**ONLINE, "candidate_kind": kind, "verifier_version": verifier}
    if verifier == "<missing>":
        del candidate["verifier_version"]
    assert fresh(candidate)["failed_checks"] == ["branch_evidence"]


@pytest.mark.parametrize("kind", ["grpo", "rlvr"])
def test_online_ignores_preference_evidence(kind: str) -> None:
    """Online candidates are not asked for DPO preference evidence."""
    candidate = {**ONLINE, "candidate_kind": kind, "preference_evidence_version": ""}
    assert fresh(candidate) == {"fresh": True, "failed_checks": []}


@pytest.mark.parametrize("window_age", [99, -5, 0, "stale", None, True, "<missing>"])
def test_dpo_ignores_window_age(window_age: Any) -> None:
    """Offline DPO evidence has no rollout window: any window age, or none, leaves it fresh."""
    candidate = {**DPO, "window_age": window_age}
    if window_age == "<missing>":
        del candidate["window_age"]
    assert fresh(candidate) == {"fresh": True, "failed_checks": []}


def test_dpo_needs_no_verifier() -> None:
    """DPO freshness does not read verifier_version."""
    assert fresh({**DPO, "verifier_version": ""})["fresh"]


def test_maximum_age_is_a_parameter() -> None:
    """The maximum window age comes from the caller, not a constant."""
    assert not fresh({**ONLINE, "window_age": 5}, max_age=4)["fresh"]
    assert fresh({**ONLINE, "window_age": 5}, max_age=5)["fresh"]
    assert fresh({**ONLINE, "window_age": 0}, max_age=0)["fresh"]


# --- hand-off -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("upstream", "status", "failures"),
    [
        ("accept", "ready_for_evaluation", []),
        ("tune", "tune", []),
        ("reject", "reject", ["upstream_reject"]),
        ("maybe", "reject", ["upstream_state"]),
        ("ACCEPT", "reject", ["upstream_state"]),
        ("", "reject", ["upstream_state"]),
        (None, "reject", ["upstream_state"]),
    ],
)
def test_handoff_with_clean_evidence(upstream: Any, status: str, failures: list[str]) -> None:
    """With every hard check passing, the upstream decision alone sets the hand-off."""
    result = decide_lifecycle_handoff(upstream, {"fresh": True}, GOOD_EVIDENCE)
    assert result == {"handoff_status": status, "upstream_decision": upstream, "hard_failures": failures}


@pytest.mark.parametrize("upstream", ["accept", "tune"])
@pytest.mark.parametrize(
    ("is_fresh", "rollback", "artifact", "failures"),
    [
        (False, True, True, ["freshness"]),
        (True, False, True, ["rollback"]),
        (True, True, False, ["artifact"]),
        (False, False, True, ["freshness", "rollback"]),
        (False, True, False, ["freshness", "artifact"]),
        (True, False, False, ["rollback", "artifact"]),
        (False, False, False, ["freshness", "rollback", "artifact"]),
    ],
)
def test_any_hard_failure_rejects(
    upstream: str, is_fresh: bool, rollback: bool, artifact: bool, failures: list[str]
) -> None:
    """Any failed hard check rejects, even an upstream accept or tune, listing them in order."""
    evidence = {"rollback_ready": rollback, "artifact_verified": artifact}
    result = decide_lifecycle_handoff(upstream, {"fresh": is_fresh}, evidence)
    assert result == {"handoff_status": "reject", "upstream_decision": upstream, "hard_failures": failures}


@pytest.mark.parametrize(("upstream", "extra"), [("reject", "upstream_reject"), ("later", "upstream_state")])
def test_upstream_failure_comes_after_hard_checks(upstream: str, extra: str) -> None:
    """The upstream failure is listed after freshness, rollback and artifact."""
    evidence = {"rollback_ready": False, "artifact_verified": False}
    result = decide_lifecycle_handoff(upstream, {"fresh": False}, evidence)
    assert result["hard_failures"] == ["freshness", "rollback", "artifact", extra]
    assert result["handoff_status"] == "reject"


def test_the_freshness_checks_table_lists_every_check_in_the_order_they_fail() -> None:
    """A candidate with nothing right fails every check, in `FRESHNESS_CHECKS` order: the table that sorts
    the ledger's own failures, validates `log --reason` and drives the drills is the function's."""
    result = check_candidate_freshness({}, ACTIVE, MAX_AGE)
    assert result == {"fresh": False, "failed_checks": list(FRESHNESS_CHECKS)}


@pytest.mark.parametrize(
    ("index", "age"), [(0, 1), (1, 0), (2, -1), (-1, None), (-5, None), (True, None), (None, None)]
)
def test_window_age_of_an_evidence_window_index(index: Any, age: int | None) -> None:
    """A negative index names no window: it has no age (branch evidence fails), never `active - index`."""
    assert window_age({"evidence_window_index": index}, 1) == age
