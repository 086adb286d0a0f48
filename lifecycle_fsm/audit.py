"""`lifecycle audit`: the source workflow's real-artifact audit, on top of the ledger.

`real_artifact` drives the `Ledger` (baseline, window, receive, check, hand off) and builds its
records from the state those events fold to; `dry_run` (`plan`) says what it would do from the
manifests alone, writing nothing. Everything that can be refused without the ledger is refused
before it is opened, and every conflict with the ledger before the first append.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from lifecycle_fsm import audit_records, decisions
from lifecycle_fsm.artifact_walk import folder_problem
from lifecycle_fsm.artifacts import path_escapes_root
from lifecycle_fsm.checks import window_age
from lifecycle_fsm.decisions import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE
from lifecycle_fsm.errors import ConflictError, IllegalCommandError, InputError, NotFoundError
from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.folders import prove_writable
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.limits import check_candidate_id, check_int
from lifecycle_fsm.manifests import (
    BaselineManifest,
    CandidateManifest,
    default_id,
    load_baseline_manifest,
    load_candidate_manifest,
    utc_now,
)
from lifecycle_fsm.rules import ONLINE_KINDS, check_candidate_freshness
from lifecycle_fsm.seals import seal
from lifecycle_fsm.state import LedgerSettings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@attrs.frozen
class AuditRequest:
    """What the user asked for (the CLI's flags and their defaults)."""

    baseline: Path
    candidates: tuple[Path, ...]
    label: str
    out: Path = Path("results")
    root: Path | None = Path(".")  # the artifact root; None: each path beside its manifest
    replace: bool = False
    active_window: int = DEFAULT_ACTIVE_WINDOW
    max_window_age: int = DEFAULT_MAX_WINDOW_AGE


@attrs.frozen
class AuditCandidate:
    """A candidate manifest that exists and parses, with the id the ledger knows it by."""

    relative: str  # to the baseline manifest's folder, POSIX
    candidate_id: str
    manifest: CandidateManifest


@attrs.frozen
class PreparedAudit:
    """Every manifest parsed and every path resolved; nothing touched yet."""

    request: AuditRequest
    root: str | None  # absolute
    baseline: BaselineManifest
    baseline_dir: str
    candidates: tuple[AuditCandidate, ...]
    missing: tuple[str, ...]  # candidate manifests that do not exist, relative paths
    evidence_path: Path
    handoff_path: Path
    existing_records: tuple[Path, ...]  # what --replace would move to .previous


@attrs.frozen
class AuditResult:
    """The records a real_artifact run wrote, and where."""

    evidence_path: Path
    handoff_path: Path
    evidence: JSON
    handoff: JSON
    replaced: tuple[Path, ...]

    @property
    def handoff_status(self) -> str:
        return str(self.handoff["handoff_status"])


def prepare(request: AuditRequest) -> PreparedAudit:
    """Validate the label and parse every manifest (InputError on anything malformed)."""
    label = audit_records.validate_label(request.label)
    check_int("--active-window", request.active_window)  # an int, not a bool, 0..2^63-1
    check_int("--max-window-age", request.max_window_age)
    if os.path.exists(request.out) and not os.path.isdir(request.out):
        raise InputError(f"--out {request.out} exists and is not a folder")
    if request.root is not None and (problem := folder_problem(request.root)):
        raise InputError(f"--root {request.root} {problem}")
    root = None if request.root is None else os.path.abspath(request.root)
    evidence_path, handoff_path = audit_records.record_paths(request.out, label)
    baseline = load_baseline_manifest(request.baseline, root)
    baseline_dir = os.path.dirname(baseline.path)
    candidates: dict[str, AuditCandidate] = {}  # by id
    missing: list[str] = []
    for path in request.candidates:
        relative = audit_records.relative_posix(path, baseline_dir)
        if not os.path.exists(path):
            missing.append(relative)
            continue
        manifest = load_candidate_manifest(path, root)
        cid = default_id(manifest.fields, relative)
        # Refused here, before anything is appended (receive would refuse it after earlier candidates).
        check_candidate_id(
            cid,
            hint=f"{relative}: audit names a candidate by its policy_version; "
            "change it, or receive that manifest with `lifecycle receive --id`",
        )
        if cid in candidates:
            raise InputError(f"candidate manifests {candidates[cid].relative} and {relative} both have the id {cid!r}")
        candidates[cid] = AuditCandidate(relative, cid, manifest)
    return PreparedAudit(
        request=attrs.evolve(request, label=label),
        root=root,
        baseline=baseline,
        baseline_dir=baseline_dir,
        candidates=tuple(candidates.values()),
        missing=tuple(missing),
        evidence_path=evidence_path,
        handoff_path=handoff_path,
        existing_records=tuple(p for p in (evidence_path, handoff_path) if os.path.lexists(p)),
    )


def _blockers(prepared: PreparedAudit) -> list[str]:
    """Why a real_artifact run would be refused before touching the ledger."""
    blockers = []
    if not prepared.candidates:
        listed = ", ".join(prepared.missing) or "none given"
        blockers.append(f"no candidate manifest exists ({listed}); real_artifact needs at least one")
    try:
        audit_records.refuse_existing((prepared.evidence_path, prepared.handoff_path), prepared.request.replace)
    except InputError as e:
        blockers.append(str(e))
    return blockers


def check_runnable(prepared: PreparedAudit) -> None:
    """Refuse a real_artifact run that cannot write its records, before the ledger is opened: once the
    audit's events are in the ledger it is too late to refuse."""
    if blockers := _blockers(prepared):
        raise InputError(blockers[0])
    prove_writable(prepared.evidence_path.parent, "records folder")


def missing_fields(fields: JSON) -> list[str]:
    """Manifest fields the checks need but this candidate manifest lacks."""
    kind = fields.get("candidate_kind")
    names = ["semantic_id"] if kind is None else []
    required = ("source_policy_version", "policy_version", "evaluation_version", "decision")
    names += [key for key in required if fields.get(key) in (None, "")]
    if not fields.get("adapter_sha256"):
        names.append("artifacts.adapter.sha256")
    if kind == "dpo" and not fields.get("preference_evidence_version"):
        names.append("source_evidence")
    if kind in ONLINE_KINDS:
        if not fields.get("verifier_version"):
            names.append("trajectory_identity.verifier_version")
        if type(fields.get("evidence_window_index")) is not int:
            names.append("evidence_window_index")
    return names


def _path_plan(resolved: str, written: Any, root: str | None) -> JSON:
    # A path outside --root is not even looked at; real_artifact will not read it either.
    escapes = root is not None and path_escapes_root(resolved, root)
    return {"path": written, "escapes_root": escapes, "exists": None if escapes else os.path.exists(resolved)}


def plan(prepared: PreparedAudit) -> JSON:
    """What a real_artifact run would do, from the manifests alone (no hashing, no ledger)."""
    request = prepared.request
    policy = prepared.baseline.adapter_sha256
    candidates = []
    for c in prepared.candidates:
        fields = c.manifest.fields
        age = window_age(fields, request.active_window)
        candidates.append(
            {
                "candidate_id": c.candidate_id,
                "manifest_path": c.relative,
                "semantic_id": fields.get("semantic_id"),
                "candidate_kind": fields.get("candidate_kind"),
                "upstream_decision": fields.get("decision"),
                "artifact": _path_plan(fields["adapter_resolved_path"], fields.get("adapter_path"), prepared.root),
                "missing_fields": missing_fields(fields),
                "freshness_preview": check_candidate_freshness(
                    {**fields, "window_age": age}, policy, request.max_window_age
                ),
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
    baseline = prepared.baseline
    return {
        "run_mode": "dry_run",
        "run_label": request.label,
        "writes": "nothing",
        "baseline_manifest": audit_records.relative_posix(baseline.path, prepared.baseline_dir),
        "active_policy_version": policy,
        "active_window": request.active_window,
        "maximum_window_age": request.max_window_age,
        "root": prepared.root,
        "rollback": _path_plan(baseline.adapter_path, baseline.adapter_path_as_written, prepared.root),
        "candidates": candidates,
        "missing_candidate_manifests": list(prepared.missing),
        "records": {"evidence": str(prepared.evidence_path), "handoff": str(prepared.handoff_path)},
        "would_replace": [str(p) for p in prepared.existing_records] if request.replace else [],
        "blockers": _blockers(prepared),
        "steps": steps,
    }


def _preflight(ledger: Ledger, settings: LedgerSettings, prepared: PreparedAudit) -> None:
    """Refuse, before any append, a window the ledger cannot take or a manifest `receive` would refuse."""
    request = prepared.request
    if settings.initialized and settings.max_window_age != request.max_window_age:
        raise ConflictError(
            f"the ledger's max window age is {settings.max_window_age}, not {request.max_window_age}: "
            f"audit with --max-window-age {settings.max_window_age}, or into a new ledger"
        )
    if settings.initialized and settings.active_window is not None and settings.active_window > request.active_window:
        raise ConflictError(
            f"the ledger's active window is already {settings.active_window}; the window only advances: "
            f"audit with --active-window {settings.active_window} or higher"
        )
    for c in prepared.candidates:
        try:
            decisions.receive(ledger.candidate(c.candidate_id), c.candidate_id, c.manifest)
        except NotFoundError:
            continue
        except IllegalCommandError as e:
            raise ConflictError(f"{c.relative}: {e} (give it a new policy_version)") from None


def _process(ledger: Ledger, c: AuditCandidate) -> None:
    """Receive (idempotent), then check and hand off as far as the machine allows; every artifact is
    re-read (`rehash`): artifacts can change after a decision."""
    cid = c.candidate_id
    ledger.receive(c.manifest.path, candidate_id=cid)
    state = ledger.candidate(cid).state
    if state in ("ready", "tune"):
        ledger.check(cid, rehash=True)
        return
    if state == "received":
        state = ledger.check(cid, rehash=True).state or state
    if state == "verified":
        ledger.hand_off(cid, rehash=True)
    # reject and recovering: recorded as they stand


def run(prepared: PreparedAudit, ledger: Ledger, *, signing_key: Ed25519PrivateKey | None = None) -> AuditResult:
    """Drive the ledger through the audit, then write both records, with `ledger_head` and, given a
    signing key, `signed_head`: the audit seals that head so an auditor can keep it outside the file."""
    check_runnable(prepared)
    request = prepared.request
    if ledger.artifact_root != prepared.root:  # one rule for every path the audit and the ledger read
        raise InputError(
            f"the ledger's artifact root is {ledger.artifact_root}, the audit's is {prepared.root}: "
            "open the ledger with the audit's root"
        )
    settings = ledger.settings()
    _preflight(ledger, settings, prepared)
    start = ledger.store.head().seq
    if not settings.initialized:
        ledger.init(request.max_window_age, request.active_window)
    elif settings.active_window != request.active_window:
        ledger.advance_window(request.active_window)
    ledger.activate_baseline(prepared.baseline.path)
    for c in prepared.candidates:
        _process(ledger, c)
    settings = ledger.settings()
    records = [
        audit_records.candidate_record(
            ledger.candidate(c.candidate_id),
            manifest_path=c.relative,
            manifest_sha256=c.manifest.sha256,
            adapter=c.manifest.adapter,
            baseline_adapter_path=prepared.baseline.adapter_path_as_written,
            baseline_sha256=prepared.baseline.adapter_sha256,
            events=[e for e in ledger.store.read_stream(stream_of(c.candidate_id)) if e.seq > start],
        )
        for c in prepared.candidates
    ]
    ledger_events = [{"seq": e.seq, "type": e.type} for e in ledger.store.read_stream(LEDGER_STREAM) if e.seq > start]
    common = {
        "schema_version": audit_records.SCHEMA_VERSION,
        "semantic_id": audit_records.SEMANTIC_ID,
        "run_label": request.label,
        "active_policy_version": settings.active_policy_version,
        "baseline_manifest": audit_records.relative_posix(prepared.baseline.path, prepared.baseline_dir),
        "candidate_records": records,
        "recovery_scenarios": audit_records.recovery_scenarios(),
    }
    evidence = {
        **common,
        "run_mode": "real_artifact",
        "active_window": settings.active_window,
        "maximum_window_age": settings.max_window_age,
        "missing_candidate_manifests": list(prepared.missing),
        "ledger_events": ledger_events,
    }
    ready = any(r["handoff_status"] == "ready_for_evaluation" for r in records)
    handoff = {
        **common,
        "handoff_status": "ready" if ready else "no_ready_candidate",
        "source_evidence": prepared.evidence_path.name,
    }
    head = ledger.store.head()
    trust: JSON = {"ledger_head": {"seq": head.seq, "hash": head.hash}}
    sealer = None
    if signing_key is not None:
        sealer = functools.partial(seal, ledger.store, signing_key, actor=ledger.actor, clock=utc_now)
    paths = (prepared.evidence_path, prepared.handoff_path)
    replaced = audit_records.write_records(paths, (evidence, handoff), trust, replace=request.replace, sealer=sealer)
    return AuditResult(prepared.evidence_path, prepared.handoff_path, evidence, handoff, tuple(replaced))
