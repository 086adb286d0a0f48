"""The audit's dry run: what a `real_artifact` run would do, from the manifests alone.

No hashing and no ledger: each manifest's fields are checked for what the checks need,
each artifact path for whether it exists and stays inside the root, and freshness is
previewed with the same rule the check applies.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lifecycle_fsm.artifacts import path_escapes_root
from lifecycle_fsm.audit_records import refuse_existing, relative_posix
from lifecycle_fsm.checks import window_age
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.rules import ONLINE_KINDS, check_candidate_freshness

if TYPE_CHECKING:
    from lifecycle_fsm.audit import PreparedAudit

__all__ = ["blockers", "missing_fields", "plan"]


def blockers(prepared: PreparedAudit) -> list[str]:
    """Why a real_artifact run would be refused before touching the ledger."""
    blockers = []
    if not prepared.candidates:
        listed = ", ".join(prepared.missing) or "none given"
        blockers.append(f"no candidate manifest exists ({listed}); real_artifact needs at least one")
    try:
        refuse_existing((prepared.evidence_path, prepared.handoff_path), prepared.request.replace)
    except InputError as e:
        blockers.append(str(e))
    return blockers


def missing_fields(fields: JSON) -> list[str]:
    """Manifest fields the checks need but this candidate manifest lacks."""
    names = []
    kind = fields.get("candidate_kind")
    if kind is None:
        names.append("semantic_id")
    for key in ("source_policy_version", "policy_version", "evaluation_version", "decision"):
        if fields.get(key) in (None, ""):
            names.append(key)
    if not fields.get("adapter_sha256"):
        names.append("artifacts.adapter.sha256")
    if kind == "dpo" and not fields.get("preference_evidence_version"):
        names.append("source_evidence")
    if kind in ONLINE_KINDS:
        if not fields.get("verifier_version"):
            names.append("trajectory_identity.verifier_version")
        index = fields.get("evidence_window_index")
        if not isinstance(index, int) or isinstance(index, bool):
            names.append("evidence_window_index")
    return names


def _path_plan(resolved: str, written: Any, root: str | None) -> JSON:
    escapes = root is not None and path_escapes_root(resolved, root)
    # A path outside --root is not even looked at; real_artifact will not read it either.
    return {"path": written, "escapes_root": escapes, "exists": None if escapes else os.path.exists(resolved)}


def plan(prepared: PreparedAudit) -> JSON:
    """What a real_artifact run would do, from the manifests alone (no hashing, no ledger)."""
    request = prepared.request
    policy = prepared.baseline.adapter_sha256
    candidates = []
    for c in prepared.candidates:
        fields = c.manifest.fields
        age = window_age(fields, request.active_window)
        preview = check_candidate_freshness({**fields, "window_age": age}, policy, request.max_window_age)
        candidates.append(
            {
                "candidate_id": c.candidate_id,
                "manifest_path": c.relative,
                "semantic_id": fields.get("semantic_id"),
                "candidate_kind": fields.get("candidate_kind"),
                "upstream_decision": fields.get("decision"),
                "artifact": _path_plan(fields["adapter_resolved_path"], fields.get("adapter_path"), prepared.root),
                "missing_fields": missing_fields(fields),
                "freshness_preview": preview,
            }
        )
    steps = [
        f"initialise the ledger (max window age {request.max_window_age}, active window {request.active_window}) "
        "if new, else advance it to that window",
        f"activate the baseline {policy} unless it is already active",
        *(
            f"receive {c.candidate_id}, check it and hand it off if verified "
            "(re-check only if ready/tune; record as it stands if reject/recovering)"
            for c in prepared.candidates
        ),
        f"write {prepared.evidence_path} and {prepared.handoff_path}",
    ]
    return {
        "run_mode": "dry_run",
        "run_label": request.label,
        "writes": "nothing",
        "baseline_manifest": relative_posix(prepared.baseline.path, prepared.baseline_dir),
        "active_policy_version": policy,
        "active_window": request.active_window,
        "maximum_window_age": request.max_window_age,
        "root": prepared.root,
        "rollback": _path_plan(
            prepared.baseline.adapter_path, prepared.baseline.adapter_path_as_written, prepared.root
        ),
        "candidates": candidates,
        "missing_candidate_manifests": list(prepared.missing),
        "records": {"evidence": str(prepared.evidence_path), "handoff": str(prepared.handoff_path)},
        "would_replace": [str(p) for p in prepared.existing_records] if request.replace else [],
        "blockers": blockers(prepared),
        "steps": steps,
    }
