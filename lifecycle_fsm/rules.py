"""The workflow's three lifecycle decisions as pure functions (no I/O, no clock), with the workflow's own
names, arguments and return keys, so code written against it runs unchanged; and `RecoveryPlan`, the
typed plan a supervisor follows after `fail_stage` (a `RecoveryPlanned` payload read back, no schema of
its own, so a plan read from a months-old event looks the same as one just decided)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

import attrs

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


SkipReason = Literal["not_recorded", "invalidated", "hash_changed", "missing"]


@attrs.frozen(kw_only=True)
class RecoveryPlan:
    """A recorded recovery plan: resume from `path` (digest `sha256`) with `action`, or block.

    `skipped`: each trusted state passed over and why, nearest first. `checkpoint`: for a sampling or
    reward plan, the intact model checkpoint to resume from. `note`: what else the supervisor must know
    (the baseline it rolls back to is no longer active). `seq`: the `RecoveryPlanned` event.
    """

    stage: str
    action: RecoveryAction
    recovery_state: str | None
    reused_state: bool
    path: str | None
    sha256: str | None
    blocking: bool
    skipped: tuple[tuple[str, SkipReason], ...]
    note: str | None = None
    checkpoint: str | None = None
    checkpoint_sha256: str | None = None
    seq: int | None = None


def _skip_reason(seen: Mapping[str, Any], invalidated: bool) -> SkipReason:
    if seen.get("source") is None:  # nothing to re-hash at plan time
        return "invalidated" if invalidated else "not_recorded"
    if seen.get("actual") is None:
        return "missing"
    return "hash_changed"


def plan_from_payload(
    payload: Mapping[str, Any], *, seq: int | None, invalidated: Collection[str] = ()
) -> RecoveryPlan:
    """The plan a `RecoveryPlanned` payload records; `invalidated`: kinds invalidated before it."""
    stage = payload["stage"]
    chosen = payload["recovery_state"]
    seen_by_kind: Mapping[str, Any] = payload["trusted_states"]
    skipped: list[tuple[str, SkipReason]] = []
    for kind in RECOVERY_STATES_BY_STAGE.get(stage, tuple(sorted(seen_by_kind))):
        if kind == chosen:
            break
        seen = seen_by_kind.get(kind, {"source": None})
        skipped.append((kind, _skip_reason(seen, kind in invalidated)))
    used = seen_by_kind.get(chosen, {}) if chosen is not None else {}
    resume = payload.get("checkpoint") or {}
    resume = resume if resume.get("available") else {}
    return RecoveryPlan(
        stage=stage,
        action=RecoveryAction(payload["action"]),
        recovery_state=chosen,
        reused_state=bool(payload["reused_state"]),
        path=used.get("path"),
        sha256=used.get("actual"),
        blocking=bool(payload["blocking"]),
        skipped=tuple(skipped),
        note=used.get("note"),
        checkpoint=resume.get("path"),
        checkpoint_sha256=resume.get("actual"),
        seq=seq,
    )


def invalidated_kinds(history: Iterable[tuple[int, str, Mapping[str, Any]]], *, before: int) -> frozenset[str]:
    """Trusted-state kinds whose latest record before seq `before` in one candidate's `(seq, type, payload)`
    history is an invalidation."""
    last: dict[str, str] = {}
    for seq, type_name, payload in history:
        if seq >= before:
            break
        if type_name in ("TrustedStateRecorded", "TrustedStateInvalidated"):
            last[payload["kind"]] = type_name
    return frozenset(kind for kind, type_name in last.items() if type_name == "TrustedStateInvalidated")
