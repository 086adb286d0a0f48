"""The workflow's three lifecycle decisions as pure functions (no I/O, no clock), with the workflow's own
names, arguments and return keys, so code written against it runs unchanged."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from lifecycle_fsm.json_types import JSON

# The rules' version and a digest of what they decide over fixed inputs (tests/test_rules_version.py
# recomputes it: change a rule, and it says to bump the version). Every check and hand-off records them.
RULES = {"version": 3, "digest": "8aa2142e263fa2887d9ba0edf6c929c96c3b5093e5ee43f9bb86bef4c40d0dea"}

CANDIDATE_KINDS = ("dpo", "grpo", "rlvr")
ONLINE_KINDS = ("grpo", "rlvr")
# The kind a manifest's `semantic_id` names; an explicit `candidate_kind` may refine grpo to rlvr.
KIND_BY_SEMANTIC_ID = {"PT-DPO-OFFLINE": "dpo", "PT-GRPO-GROUPWISE": "grpo"}
FRESHNESS_CHECKS = ("candidate_kind", "source_policy", "candidate_identity", "evaluation_identity", "branch_evidence")
UPSTREAM_DECISIONS = ("accept", "tune", "reject")

# Trusted states a failed stage may resume from, nearest (cheapest to redo) first.
RECOVERY_STATES_BY_STAGE: dict[str, tuple[str, ...]] = {
    "sampling": ("prompt_queue",),
    "reward": ("trajectories", "prompt_queue"),
    "update": ("pre_update_checkpoint", "verified_baseline"),
    "artifact_validation": ("verified_baseline",),
}
STAGES = tuple(RECOVERY_STATES_BY_STAGE)
TRUSTED_STATE_KINDS = ("prompt_queue", "trajectories", "pre_update_checkpoint", "verified_baseline")


class RecoveryAction(StrEnum):
    """What the supervisor does next after a stage failed (the workflow's actions)."""

    RETRY_SAMPLING_FROM_PROMPT_QUEUE = "retry_sampling_from_prompt_queue"
    REBUILD_PROMPT_QUEUE = "rebuild_prompt_queue"
    RESUME_REWARD_FROM_SAVED_TRAJECTORIES = "resume_reward_from_saved_trajectories"
    RESTART_SAMPLING_FROM_PROMPT_QUEUE = "restart_sampling_from_prompt_queue"
    RESTART_SAMPLING = "restart_sampling"
    RESTORE_PRE_UPDATE_CHECKPOINT = "restore_pre_update_checkpoint"
    ROLLBACK_TO_VERIFIED_BASELINE = "rollback_to_verified_baseline"
    BLOCK_UPDATE = "block_update"
    BLOCK_RELEASE = "block_release"


A = RecoveryAction
_ACTION_BY_STAGE_AND_STATE: dict[tuple[str, str | None], RecoveryAction] = {
    ("sampling", "prompt_queue"): A.RETRY_SAMPLING_FROM_PROMPT_QUEUE,
    ("reward", "trajectories"): A.RESUME_REWARD_FROM_SAVED_TRAJECTORIES,
    ("reward", "prompt_queue"): A.RESTART_SAMPLING_FROM_PROMPT_QUEUE,
    ("update", "pre_update_checkpoint"): A.RESTORE_PRE_UPDATE_CHECKPOINT,
    ("update", "verified_baseline"): A.ROLLBACK_TO_VERIFIED_BASELINE,
    ("artifact_validation", "verified_baseline"): A.ROLLBACK_TO_VERIFIED_BASELINE,
}
_FALLBACK_BY_STAGE = {
    "sampling": A.REBUILD_PROMPT_QUEUE,
    "reward": A.RESTART_SAMPLING,
    "update": A.BLOCK_UPDATE,
    "artifact_validation": A.BLOCK_RELEASE,
}
# Fallbacks that stop the candidate instead of redoing work: they end in `reject`.
BLOCKING_ACTIONS = frozenset({A.BLOCK_UPDATE, A.BLOCK_RELEASE})
del A


def _age_within(value: Any, maximum: int) -> bool:
    """An integer (not a bool) window age in [0, maximum]; anything else is not fresh."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum


def is_identity(value: Any) -> bool:
    """A version or identity is a non-blank printable string, not merely truthy (the seed's `bool(value)`
    passes `true` or `1`; `dpo-v6\\n` prints like `dpo-v6`)."""
    return isinstance(value, str) and bool(value.strip()) and value.isprintable()


def _kind_holds(kind: Any, semantic_id: Any) -> bool:
    """A candidate kind, and not of the other family than the one its `semantic_id` names: a
    PT-GRPO-GROUPWISE manifest that says `dpo` would skip the window and verifier checks."""
    if kind not in CANDIDATE_KINDS:
        return False
    named = KIND_BY_SEMANTIC_ID.get(semantic_id) if isinstance(semantic_id, str) else None
    return named is None or (kind in ONLINE_KINDS) == (named in ONLINE_KINDS)


def check_candidate_freshness(candidate: JSON, active_policy_version: str, maximum_window_age: int) -> JSON:
    """Is the candidate's lineage and branch evidence still current? (Not its upstream decision; a missing
    or non-integer `window_age` fails an online candidate's branch evidence, never a default.)"""
    kind = candidate.get("candidate_kind")
    checks = {
        "candidate_kind": _kind_holds(kind, candidate.get("semantic_id")),
        "source_policy": bool(active_policy_version)
        and candidate.get("source_policy_version") == active_policy_version,
        "candidate_identity": is_identity(candidate.get("policy_version")),
        "evaluation_identity": is_identity(candidate.get("evaluation_version")),
    }
    if kind == "dpo":
        checks["branch_evidence"] = is_identity(candidate.get("preference_evidence_version"))
    else:
        age_ok = _age_within(candidate.get("window_age"), maximum_window_age)
        checks["branch_evidence"] = is_identity(candidate.get("verifier_version")) and age_ok
    return {"fresh": all(checks.values()), "failed_checks": [name for name, passed in checks.items() if not passed]}


def choose_recovery_action(failure: JSON) -> JSON:
    """Resume from the nearest trusted state the failed stage can reuse, else fall back."""
    stage = failure["stage"]
    available = failure["available"]
    if stage not in RECOVERY_STATES_BY_STAGE:
        raise ValueError(f"unknown failure stage: {stage!r} (expected one of {', '.join(STAGES)})")
    recovery_state = next((s for s in RECOVERY_STATES_BY_STAGE[stage] if available.get(s)), None)
    if recovery_state is None:
        action = _FALLBACK_BY_STAGE[stage]
    else:
        action = _ACTION_BY_STAGE_AND_STATE[(stage, recovery_state)]
    return {
        "stage": stage,
        "recovery_state": recovery_state,
        "reused_state": recovery_state is not None,
        "action": action.value,  # a plain string, as the workflow's rule returns it
    }


def decide_lifecycle_handoff(upstream_decision: str, freshness: JSON, evidence: JSON) -> JSON:
    """Propagate the upstream decision through the lifecycle's hard checks."""
    hard_checks = {
        "freshness": freshness["fresh"],
        "rollback": evidence["rollback_ready"],
        "artifact": evidence["artifact_verified"],
    }
    hard_failures = [name for name, passed in hard_checks.items() if not passed]
    if upstream_decision not in UPSTREAM_DECISIONS:
        hard_failures.append("upstream_state")
    elif upstream_decision == "reject":
        hard_failures.append("upstream_reject")
    if hard_failures:
        status = "reject"
    elif upstream_decision == "tune":
        status = "tune"
    else:
        status = "ready_for_evaluation"
    return {"handoff_status": status, "upstream_decision": upstream_decision, "hard_failures": hard_failures}
