"""The typed recovery plan a supervisor follows after `fail_stage`: a `RecoveryPlanned` payload read back
(no schema of its own), so a plan read from a months-old event looks the same as one just decided."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

import attrs

from lifecycle_fsm.rules import RECOVERY_STATES_BY_STAGE, RecoveryAction

__all__ = ["RecoveryAction", "RecoveryPlan", "SkipReason", "invalidated_kinds", "plan_from_payload"]

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
