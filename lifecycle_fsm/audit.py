"""`lifecycle audit`: the source workflow's real-artifact audit, on top of the ledger.

Every decision the audit reports is also an event: in `real_artifact` mode it drives
the `Ledger` (activate the baseline, set the window, receive, check, hand off) and
builds its records from the state those events fold to, citing their positions. In
`dry_run` mode it parses every manifest, checks required fields and that paths exist,
and says what `real_artifact` would do, writing nothing (not even a ledger file).

Order matters for "nothing written": everything that can be refused without the
ledger (a bad label, a used label, a malformed manifest, no candidate manifest, an
`--out` folder that cannot be created or written) is refused by `prepare` /
`check_runnable` before the ledger is opened; every conflict
with the ledger's existing settings or candidates is refused by `run` before the
first append. A relative artifact path is read under the audit's root (the ledger must be
opened with the same `artifact_root`): the project root the manifests were written against.
The dry run's plan is `audit_plan`'s; the records are `audit_records`'.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from lifecycle_fsm import decisions
from lifecycle_fsm.artifact_paths import folder_problem
from lifecycle_fsm.audit_plan import blockers as plan_blockers
from lifecycle_fsm.audit_plan import missing_fields, plan
from lifecycle_fsm.audit_records import (
    SCHEMA_VERSION,
    SEMANTIC_ID,
    candidate_record,
    record_paths,
    recovery_scenarios,
    relative_posix,
    validate_label,
    write_records,
)
from lifecycle_fsm.command_inputs import default_id
from lifecycle_fsm.errors import ConflictError, IllegalCommandError, InputError, NotFoundError
from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.folders import prove_writable
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE, Ledger, utc_now
from lifecycle_fsm.limits import check_candidate_id, check_int
from lifecycle_fsm.manifests import BaselineManifest, CandidateManifest, load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.seals import seal
from lifecycle_fsm.state import LedgerSettings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "AuditCandidate",
    "AuditRequest",
    "AuditResult",
    "MODES",
    "PreparedAudit",
    "check_runnable",
    "missing_fields",
    "plan",
    "prepare",
    "run",
]

MODES = ("dry_run", "real_artifact")


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

    path: str  # absolute
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
    label = validate_label(request.label)
    check_int("--active-window", request.active_window)  # an int, not a bool, 0..2^63-1
    check_int("--max-window-age", request.max_window_age)
    if os.path.exists(request.out) and not os.path.isdir(request.out):
        raise InputError(f"--out {request.out} exists and is not a folder")
    if request.root is not None and (problem := folder_problem(request.root)):
        raise InputError(f"--root {request.root} {problem}")
    root = None if request.root is None else os.path.abspath(request.root)
    evidence_path, handoff_path = record_paths(request.out, label)
    existing = [p for p in (evidence_path, handoff_path) if os.path.lexists(p)]
    baseline = load_baseline_manifest(request.baseline, root)
    baseline_dir = os.path.dirname(baseline.path)
    candidates: list[AuditCandidate] = []
    missing: list[str] = []
    for path in request.candidates:
        relative = relative_posix(path, baseline_dir)
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
        clash = next((c for c in candidates if c.candidate_id == cid), None)
        if clash is not None:
            raise InputError(f"candidate manifests {clash.relative} and {relative} both have the id {cid!r}")
        candidates.append(AuditCandidate(manifest.path, relative, cid, manifest))
    return PreparedAudit(
        request=attrs.evolve(request, label=label),
        root=root,
        baseline=baseline,
        baseline_dir=baseline_dir,
        candidates=tuple(candidates),
        missing=tuple(missing),
        evidence_path=evidence_path,
        handoff_path=handoff_path,
        existing_records=tuple(existing),
    )


def check_runnable(prepared: PreparedAudit) -> None:
    """Refuse a real_artifact run that cannot write its records (before the ledger is opened).

    The records' folder is created and proven writable here, not when the records are
    written: by then the audit's events are in the ledger, and a refusal must append nothing.
    """
    blockers = plan_blockers(prepared)
    if blockers:
        raise InputError(blockers[0])
    prove_writable(prepared.evidence_path.parent, "records folder")


def _settings_preflight(settings: LedgerSettings, request: AuditRequest) -> None:
    """Refuse, before any append, a window the ledger cannot take."""
    if not settings.initialized:
        return
    if settings.max_window_age != request.max_window_age:
        raise ConflictError(
            f"the ledger's max window age is {settings.max_window_age}, not {request.max_window_age}: "
            f"audit with --max-window-age {settings.max_window_age}, or into a new ledger"
        )
    if settings.active_window is not None and settings.active_window > request.active_window:
        raise ConflictError(
            f"the ledger's active window is already {settings.active_window}; the window only advances: "
            f"audit with --active-window {settings.active_window} or higher"
        )


def _candidates_preflight(ledger: Ledger, candidates: tuple[AuditCandidate, ...]) -> None:
    """Refuse, before any append, a manifest `receive` would refuse (same id, other content): its rule."""
    for c in candidates:
        try:
            decisions.receive(ledger.candidate(c.candidate_id), c.candidate_id, c.manifest)
        except NotFoundError:
            continue
        except IllegalCommandError as e:
            raise ConflictError(f"{c.relative}: {e} (give it a new policy_version)") from None


def _process(ledger: Ledger, c: AuditCandidate) -> None:
    """Receive (idempotent), then check and hand off, as far as the machine allows.

    The real-artifact audit reads every byte of every artifact (`rehash`): it never
    re-uses a digest, even one this process read a moment ago.
    """
    cid = c.candidate_id
    ledger.receive(c.path, candidate_id=cid)
    state = ledger.candidate(cid).state
    if state in ("ready", "tune"):
        ledger.check(cid, rehash=True)  # artifacts can change after a decision: re-check, keep or reject
        return
    if state == "received":
        state = ledger.check(cid, rehash=True).state or state
    if state == "verified":
        ledger.hand_off(cid, rehash=True)
    # reject and recovering: recorded as they stand


def run(prepared: PreparedAudit, ledger: Ledger, *, signing_key: Ed25519PrivateKey | None = None) -> AuditResult:
    """Drive the ledger through the audit, then write both records.

    The records carry `ledger_head` (the head after the audit's last event) and, with a
    signing key, `signed_head`: the audit seals that head, so an auditor can
    keep it outside the file.
    """
    check_runnable(prepared)
    request = prepared.request
    if ledger.artifact_root != prepared.root:  # one rule for every path the audit and the ledger read
        raise InputError(
            f"the ledger's artifact root is {ledger.artifact_root}, the audit's is {prepared.root}: "
            "open the ledger with the audit's root"
        )
    _settings_preflight(ledger.settings(), request)
    _candidates_preflight(ledger, prepared.candidates)
    start = ledger.store.head().seq
    settings = ledger.settings()
    if not settings.initialized:
        ledger.init(request.max_window_age, request.active_window)
    elif settings.active_window != request.active_window:
        ledger.advance_window(request.active_window)
    ledger.activate_baseline(prepared.baseline.path)
    for c in prepared.candidates:
        _process(ledger, c)
    settings = ledger.settings()
    records = []
    for c in prepared.candidates:
        events = [e for e in ledger.store.read_stream(stream_of(c.candidate_id)) if e.seq > start]
        records.append(
            candidate_record(
                ledger.candidate(c.candidate_id),
                manifest_path=c.relative,
                manifest_sha256=c.manifest.sha256,
                adapter=c.manifest.adapter,
                baseline_adapter_path=prepared.baseline.adapter_path_as_written,
                baseline_sha256=prepared.baseline.adapter_sha256,
                events=events,
            )
        )
    ledger_events = [{"seq": e.seq, "type": e.type} for e in ledger.store.read_stream(LEDGER_STREAM) if e.seq > start]
    scenarios = recovery_scenarios()
    baseline_manifest = relative_posix(prepared.baseline.path, prepared.baseline_dir)
    common = {"schema_version": SCHEMA_VERSION, "semantic_id": SEMANTIC_ID, "run_label": request.label}
    evidence = {
        **common,
        "run_mode": "real_artifact",
        "active_policy_version": settings.active_policy_version,
        "active_window": settings.active_window,
        "maximum_window_age": settings.max_window_age,
        "baseline_manifest": baseline_manifest,
        "candidate_records": records,
        "recovery_scenarios": scenarios,
        "missing_candidate_manifests": list(prepared.missing),
        "ledger_events": ledger_events,
    }
    head = ledger.store.head()
    trust: JSON = {"ledger_head": {"seq": head.seq, "hash": head.hash}}
    ready = any(r["handoff_status"] == "ready_for_evaluation" for r in records)
    handoff = {
        **common,
        "handoff_status": "ready" if ready else "no_ready_candidate",
        "active_policy_version": settings.active_policy_version,
        "baseline_manifest": baseline_manifest,
        "candidate_records": records,
        "source_evidence": prepared.evidence_path.name,
        "recovery_scenarios": scenarios,
    }
    sealer = None
    if signing_key is not None:
        sealer = functools.partial(seal, ledger.store, signing_key, actor=ledger.actor, clock=utc_now)
    paths = (prepared.evidence_path, prepared.handoff_path)
    replaced = write_records(paths, (evidence, handoff), trust, replace=request.replace, sealer=sealer)
    return AuditResult(prepared.evidence_path, prepared.handoff_path, evidence, handoff, tuple(replaced))
