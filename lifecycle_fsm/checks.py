"""Gathering a check's evidence from disk (the rules themselves are pure, `rules.py`): freshness, the
artifact and the rollback baseline re-hashed, typed here and JSON only in the events that record it."""

from __future__ import annotations

from typing import Any

import attrs

from lifecycle_fsm.artifact_walk import folder_problem
from lifecycle_fsm.artifacts import DigestCache, hash_tree, path_escapes_root
from lifecycle_fsm.errors import ArtifactError, ArtifactUnreadable
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.rules import (
    FRESHNESS_CHECKS,
    RECOVERY_STATES_BY_STAGE,
    check_candidate_freshness,
    decide_lifecycle_handoff,
)
from lifecycle_fsm.state import CandidateState, LedgerSettings

_UPSTREAM = ("upstream_reject", "upstream_state")  # the hand-off's own codes: not an evidence check
# The candidate's fields the freshness rule reads (with its window age).
FRESHNESS_FIELDS = (
    "candidate_kind",
    "semantic_id",
    "source_policy_version",
    "policy_version",
    "evaluation_version",
    "preference_evidence_version",
    "verifier_version",
)


@attrs.frozen
class ArtifactCheck:
    """An artifact re-hashed on disk against the hash a manifest recorded. `tree`: a folder's per-file
    listing; `reused_from`: when a digest re-used unchanged was read (None: now); `inconclusive`: the
    environment kept it from being read (`error` says how)."""

    path: str | None
    expected: Any
    actual: str | None = None
    verified: bool = False
    error: str | None = None
    tree: JSON | None = None
    reused_from: str | None = None
    inconclusive: bool = False

    def to_json(self, *, with_reuse: bool = True) -> JSON:
        return attrs.asdict(self, recurse=False, filter=lambda a, _: with_reuse or a.name != "reused_from")


@attrs.frozen
class CheckEvidence:
    """Every lifecycle check, run now: what a check or a hand-off records and decides on."""

    freshness: JSON  # the `check_candidate_freshness` result
    artifact: ArtifactCheck
    rollback: ArtifactCheck
    settings: JSON  # what it was judged against

    @property
    def inconclusive(self) -> tuple[str, ...]:
        """The checks that could not be read (the environment, not the artifact): empty when none."""
        return tuple(name for name, c in (("artifact", self.artifact), ("rollback", self.rollback)) if c.inconclusive)

    def decide(self, upstream_decision: Any) -> tuple[JSON, list[str]]:
        """The hand-off decision and its reason codes: each failed hard check (freshness as its specific
        checks), `path_escapes_root` when a path left the root, then the upstream codes."""
        decision = decide_lifecycle_handoff(
            upstream_decision,
            self.freshness,
            {"rollback_ready": self.rollback.verified, "artifact_verified": self.artifact.verified},
        )
        hard = decision["hard_failures"]
        failed = self.freshness["failed_checks"]
        reasons = [code for f in hard if f not in _UPSTREAM for code in (failed if f == "freshness" else [f])]
        if "path_escapes_root" in (self.artifact.error, self.rollback.error):
            reasons.append("path_escapes_root")
        reasons += [f for f in hard if f in _UPSTREAM]
        return decision, reasons

    @property
    def reason_codes(self) -> list[str]:
        """A check's reason codes: the hand-off's hard checks alone, upstream aside."""
        return self.decide("accept")[1]

    def payload(self) -> JSON:
        """The evidence fields of the event that records it."""
        return attrs.asdict(self)


@attrs.frozen
class TrustedStateCheck:
    """A trusted state a failed stage could resume from, re-hashed now; `available` when it still matches."""

    available: bool
    source: str | None  # recorded | active_baseline | source_baseline (no longer active) | None: nothing to re-hash
    path: str | None
    expected: str | None
    actual: str | None
    error: str | None
    note: str | None = None

    @classmethod
    def of(cls, check: ArtifactCheck, source: str, note: str | None = None) -> TrustedStateCheck:
        return cls(check.verified, source, check.path, check.expected, check.actual, check.error, note)

    def to_json(self) -> JSON:
        """Its fields, `note` only when there is one."""
        return attrs.asdict(self, recurse=False, filter=lambda a, value: a.name != "note" or value is not None)


def window_age(candidate: JSON, active_window: int | None) -> int | None:
    """Active window minus the evidence window; None (never a default) when either is unknown or the index
    is negative (`-1` would read as a window two back, still fresh)."""
    index = candidate.get("evidence_window_index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0 or active_window is None:
        return None
    return active_window - index


def verify_artifact(
    path: str | None, expected: Any, root: str | None, *, cache: DigestCache | None = None
) -> ArtifactCheck:
    """Re-hash an artifact on disk (re-using `cache`'s digest while no file changed) and compare."""
    if not path:
        return ArtifactCheck(path, expected, error="no artifact path")
    if root is not None and path_escapes_root(path, root):
        if (problem := folder_problem(root)) is not None:  # an unmounted volume or a typo: not the artifact's fault
            return ArtifactCheck(path, expected, error=f"root {root} {problem}", inconclusive=True)
        return ArtifactCheck(path, expected, error="path_escapes_root")
    try:
        digest, reused_from = (hash_tree(path, root), None) if cache is None else cache.hash_tree(path, root)
    except ArtifactError as e:
        return ArtifactCheck(path, expected, error=str(e), inconclusive=isinstance(e, ArtifactUnreadable))
    verified = isinstance(expected, str) and bool(expected) and digest.sha256 == expected
    return ArtifactCheck(path, expected, digest.sha256, verified, None, digest.to_json(), reused_from)


def freshness(candidate: JSON, settings: LedgerSettings) -> JSON:
    """The five freshness checks, the ledger's evaluation version included (the decision pool re-runs it)."""
    age = window_age(candidate, settings.active_window)
    subject = {k: candidate.get(k) for k in FRESHNESS_FIELDS} | {"window_age": age}
    result = check_candidate_freshness(subject, settings.active_policy_version or "", settings.max_window_age or 0)
    failed = set(result["failed_checks"])
    if settings.evaluation_version not in (None, candidate.get("evaluation_version")):
        failed.add("evaluation_identity")  # the ledger's evaluation version, once set, is part of the identity
    return {"fresh": not failed, "failed_checks": [c for c in FRESHNESS_CHECKS if c in failed]}


def gather_checks(
    candidate: JSON, settings: LedgerSettings, *, root: str | None = None, cache: DigestCache | None = None
) -> CheckEvidence:
    """Run every lifecycle check now (an unchanged artifact's digest re-used from `cache`)."""
    baseline = settings.baseline or {}
    return CheckEvidence(
        freshness=freshness(candidate, settings),
        artifact=verify_artifact(
            candidate.get("adapter_resolved_path"), candidate.get("adapter_sha256"), root, cache=cache
        ),
        rollback=verify_artifact(baseline.get("adapter_path"), baseline.get("adapter_sha256"), root, cache=cache),
        settings=settings.summary()
        | {"window_age": window_age(candidate, settings.active_window), "ledger_version": settings.version},
    )


def baseline_rollback(current: CandidateState, settings: LedgerSettings, root: str | None) -> TrustedStateCheck:
    """The baseline to roll back to, re-hashed: the one the candidate branched from while this ledger
    activated it and it re-hashes, else the active one."""
    active, note = settings.baseline or {}, None
    own = settings.baselines.get(str(current.candidate.get("source_policy_version")))
    if own is not None and own["policy_version"] != settings.active_policy_version:
        note = (
            f"the baseline this candidate branched from ({own['policy_version']}) is no longer the "
            f"active one ({settings.active_policy_version}): after the rollback its checks fail "
            "source_policy until it is trained again from the active baseline"
        )
        check = verify_artifact(own["adapter_path"], own["adapter_sha256"], root)
        if check.verified:
            return TrustedStateCheck.of(check, "source_baseline", note)
    check = verify_artifact(active.get("adapter_path"), active.get("adapter_sha256"), root)
    return TrustedStateCheck.of(check, "active_baseline", note)


def trusted_state_evidence(
    current: CandidateState, settings: LedgerSettings, stage: str, root: str | None
) -> dict[str, TrustedStateCheck]:
    """Re-hash each trusted state this stage could reuse (available only if it still matches); an unrecorded
    `verified_baseline` is an activated baseline (`baseline_rollback`)."""
    evidence: dict[str, TrustedStateCheck] = {}
    for kind in RECOVERY_STATES_BY_STAGE[stage]:
        recorded = current.trusted_states.get(kind)
        if kind == "verified_baseline" and recorded is not None and recorded["sha256"] not in settings.baselines:
            recorded = None  # recorded before it had to be an activated baseline's adapter: never rolled back to
        if recorded is not None:
            check = verify_artifact(recorded["path"], recorded["sha256"], root)
            evidence[kind] = TrustedStateCheck.of(check, "recorded")
        elif kind == "verified_baseline" and settings.baseline is not None:
            evidence[kind] = baseline_rollback(current, settings, root)
        else:
            evidence[kind] = TrustedStateCheck(False, None, None, None, None, "not recorded")
    return evidence


def resume_checkpoint(current: CandidateState, stage: str, root: str | None) -> TrustedStateCheck | None:
    """For a sampling or reward failure, the trusted model checkpoint a trainer resumes from (re-hashed)."""
    recorded = current.trusted_states.get("pre_update_checkpoint")
    if stage not in ("sampling", "reward") or recorded is None:
        return None
    return TrustedStateCheck.of(verify_artifact(recorded["path"], recorded["sha256"], root), "recorded")
