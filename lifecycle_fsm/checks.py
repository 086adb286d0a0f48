"""Gathering a check's evidence: freshness, artifact re-hash, rollback re-hash.

The rules are pure (rules.py); this module is the part that touches the disk, and
turns what it saw into the evidence dicts events carry: expected vs actual hash,
the settings read, and `reason_codes` naming each specific failed check.
"""

from __future__ import annotations

from typing import Any

from lifecycle_fsm.artifacts import hash_tree, path_escapes_root
from lifecycle_fsm.digest_cache import DigestCache
from lifecycle_fsm.errors import ArtifactError
from lifecycle_fsm.rules import (
    FRESHNESS_CHECKS,
    RECOVERY_STATES_BY_STAGE,
    check_candidate_freshness,
    decide_lifecycle_handoff,
)
from lifecycle_fsm.state import CandidateState, LedgerSettings

__all__ = [
    "CheckEvidence",
    "freshness",
    "gather_checks",
    "handoff_reason_codes",
    "trusted_state_evidence",
    "verify_artifact",
    "window_age",
]

JSON = dict[str, Any]
CheckEvidence = dict[str, Any]
_UPSTREAM = ("upstream_reject", "upstream_state")  # the hand-off's own codes: not an evidence check


def window_age(candidate: JSON, settings: LedgerSettings) -> int | None:
    """Active window minus the evidence window; None (never a default) when unknown."""
    index = candidate.get("evidence_window_index")
    if not isinstance(index, int) or isinstance(index, bool) or settings.active_window is None:
        return None
    return settings.active_window - index


def verify_artifact(
    path: str | None, expected: Any, root: str | None, *, cache: DigestCache | None = None, note_reuse: bool = False
) -> JSON:
    """Re-hash an artifact on disk and compare it with the hash a manifest recorded.

    `tree` is the per-file listing of a directory (`TreeDigest.to_json`), so a later
    reader can name the files that differ; None for a single file or an unreadable path.
    With `cache`, a digest whose files are all unchanged since it was read is re-used;
    `note_reuse` adds `reused_from`: when those bytes were read, or None (read now).
    """
    result: JSON = {"path": path, "expected": expected, "actual": None, "verified": False, "error": None, "tree": None}
    if note_reuse:
        result["reused_from"] = None
    if not path:
        result["error"] = "no artifact path"
        return result
    if root is not None and path_escapes_root(path, root):
        result["error"] = "path_escapes_root"
        return result
    try:
        if cache is None:
            digest = hash_tree(path, root)
        else:
            digest, reused_from = cache.hash_tree(path, root)
            if note_reuse:
                result["reused_from"] = reused_from
    except ArtifactError as e:
        result["error"] = str(e)
        return result
    result["actual"] = digest.sha256
    result["tree"] = digest.to_json()
    result["verified"] = isinstance(expected, str) and bool(expected) and result["actual"] == expected
    return result


def freshness(candidate: JSON, settings: LedgerSettings) -> JSON:
    """The five freshness checks, the ledger's evaluation version included (the decision pool re-runs it)."""
    subject = {
        "candidate_kind": candidate.get("candidate_kind"),
        "source_policy_version": candidate.get("source_policy_version"),
        "policy_version": candidate.get("policy_version"),
        "evaluation_version": candidate.get("evaluation_version"),
        "preference_evidence_version": candidate.get("preference_evidence_version"),
        "verifier_version": candidate.get("verifier_version"),
        "window_age": window_age(candidate, settings),
    }
    result = check_candidate_freshness(subject, settings.active_policy_version or "", settings.max_window_age or 0)
    active_eval = settings.evaluation_version
    failed = list(result["failed_checks"])
    if (
        active_eval is not None
        and candidate.get("evaluation_version") != active_eval
        and "evaluation_identity" not in failed
    ):
        # The ledger's evaluation version, once set, is part of the identity check.
        failed = sorted([*failed, "evaluation_identity"], key=FRESHNESS_CHECKS.index)
    return {"fresh": not failed, "failed_checks": failed}


def gather_checks(
    candidate: JSON, settings: LedgerSettings, *, root: str | None = None, cache: DigestCache | None = None
) -> CheckEvidence:
    """Run every lifecycle check now; the evidence and the specific reason codes.

    With `cache` (the Ledger's, unless `rehash`), an artifact unchanged on disk since this
    process read it is not read again; its check says so in `reused_from`.
    """
    fresh = freshness(candidate, settings)
    artifact = verify_artifact(
        candidate.get("adapter_resolved_path"), candidate.get("adapter_sha256"), root, cache=cache, note_reuse=True
    )
    baseline = settings.baseline or {}
    rollback = verify_artifact(
        baseline.get("adapter_path"), baseline.get("adapter_sha256"), root, cache=cache, note_reuse=True
    )
    evidence: CheckEvidence = {
        "freshness": fresh,
        "artifact": artifact,
        "rollback": rollback,
        "settings": settings.summary()
        | {"window_age": window_age(candidate, settings), "ledger_version": settings.version},
    }
    _, reasons = handoff_reason_codes(evidence, "accept")  # a check is the hand-off's hard checks alone
    return {"passed": not reasons, "reason_codes": reasons, **evidence}


def handoff_reason_codes(evidence: CheckEvidence, upstream_decision: Any) -> tuple[JSON, list[str]]:
    """The seed's hand-off decision over the evidence, and its reason codes: each failed hard check by
    name (a freshness failure as its specific checks), `path_escapes_root` when a path left the root.

    The order is the rule's: freshness checks, rollback, artifact, then the upstream codes.
    """
    decision = decide_lifecycle_handoff(
        upstream_decision,
        evidence["freshness"],
        {"rollback_ready": evidence["rollback"]["verified"], "artifact_verified": evidence["artifact"]["verified"]},
    )
    hard = decision["hard_failures"]
    failed = evidence["freshness"]["failed_checks"]
    reasons = [code for f in hard if f not in _UPSTREAM for code in (failed if f == "freshness" else [f])]
    if "path_escapes_root" in (evidence["artifact"]["error"], evidence["rollback"]["error"]):
        reasons.append("path_escapes_root")
    reasons += [f for f in hard if f in _UPSTREAM]
    return decision, reasons


def trusted_state_evidence(current: CandidateState, settings: LedgerSettings, stage: str, root: str | None) -> JSON:
    """Re-hash each trusted state this stage could reuse; available only if it still matches.

    Under `root`, as it was recorded (`Ledger.record_trusted_state`) and as every artifact is checked.
    """
    evidence: JSON = {}
    for kind in RECOVERY_STATES_BY_STAGE[stage]:
        recorded = current.trusted_states.get(kind)
        if recorded is not None:
            check = verify_artifact(recorded["path"], recorded["sha256"], root)
            source = "recorded"
        elif kind == "verified_baseline" and settings.baseline is not None:
            baseline = settings.baseline
            check = verify_artifact(baseline["adapter_path"], baseline["adapter_sha256"], root)
            source = "active_baseline"
        else:
            evidence[kind] = {"available": False, "source": None, "path": None, "expected": None, "actual": None,
                              "error": "not recorded"}  # fmt: skip
            continue
        evidence[kind] = {
            "available": check["verified"], "source": source, "path": check["path"],
            "expected": check["expected"], "actual": check["actual"], "error": check["error"],
        }  # fmt: skip
    return evidence
