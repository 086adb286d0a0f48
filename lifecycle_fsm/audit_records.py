"""The audit's two records: built from the ledger's state, written byte-stable and whole.

A record holds no wall-clock time and no absolute path (manifest paths relative to the baseline
manifest's folder, adapter paths as written, artifact errors as short codes), so the same inputs
audited into two ledgers give the same bytes but for `ledger_head` and `signed_head`. Each
candidate record is a superset of the source workflow's, its keys keeping their meanings.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.folders import make_folder
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.outputs import StagedFile, output_error
from lifecycle_fsm.outputs import stage as stage_file
from lifecycle_fsm.rules import choose_recovery_action, decide_lifecycle_handoff
from lifecycle_fsm.state import CandidateState
from lifecycle_fsm.store.records import StoredEvent

SCHEMA_VERSION = "post-training-lifecycle/v1"
SEMANTIC_ID = "PT-POST-TRAINING-LIFECYCLE"
_LABEL = re.compile(r"[A-Za-z0-9._-]+")

# Each failed stage with the trusted state it would reuse available.
_FAILURE_SCENARIOS: tuple[tuple[str, str], ...] = (
    ("sampling", "prompt_queue"),
    ("reward", "trajectories"),
    ("update", "pre_update_checkpoint"),
    ("artifact_validation", "verified_baseline"),
)

# A record's hand-off status by ledger state; any other state (`recovering`, ...) has none.
_HANDOFF_STATUS = {"ready": "ready_for_evaluation", "tune": "tune", "reject": "reject"}

# ArtifactError messages (artifacts.py) name absolute paths; records keep a code.
_ERROR_CODES = (
    ("path_escapes_root", "path_escapes_root"),
    ("path escapes root", "path_escapes_root"),
    ("no artifact path", "no_artifact_path"),
    ("no such file or directory", "missing"),
    ("symlink leads outside", "symlink_outside_root"),
    ("dangling symlink", "dangling_symlink"),
    ("symlink loop", "symlink_loop"),
    ("file changed while hashing", "changed_while_hashing"),
    ("special file", "special_file"),
    ("not a regular file", "special_file"),
)


def validate_label(label: str) -> str:
    """A label names the record files, so it is `[A-Za-z0-9._-]+` and nothing else."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise InputError(f"label must match [A-Za-z0-9._-]+, not {label!r}")
    return label


def record_paths(out: str | os.PathLike[str], label: str) -> tuple[Path, Path]:
    """The evidence record and the hand-off record for `label` in folder `out`."""
    folder = Path(out)
    return folder / f"lifecycle_evidence_{label}.json", folder / f"lifecycle_handoff_{label}.json"


def _previous(path: Path) -> Path:
    """Where `--replace` keeps the one previous generation of a record."""
    return path.with_name(path.name + ".previous")


def refuse_existing(
    paths: Sequence[Path],
    replace: bool,
    *,
    what: str = "records for this label",
    hint: str = "choose a new --label, or ",
) -> list[Path]:
    """Refuse a used label (or a second `.previous`); return the records `--replace` will move."""
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not replace:
        raise InputError(f"{what} already exist{'s' if what == 'a report' else ''}: {existing[0]} ({hint}--replace)")
    for p in existing:
        if os.path.lexists(_previous(p)):
            raise InputError(
                f"{_previous(p)} already exists: --replace keeps one previous generation; move it away first"
            )
    return existing


def relative_posix(path: str | os.PathLike[str], base_dir: str) -> str:
    """`path` relative to `base_dir`, lexically (no symlinks resolved), with `/` separators."""
    try:
        rel = os.path.relpath(os.path.abspath(path), base_dir)
    except ValueError:  # another drive on Windows: there is no relative path
        rel = os.path.abspath(path)
    return rel.replace(os.sep, "/")


def canonical_bytes(doc: JSON) -> bytes:
    """Sorted keys, indent 2, UTF-8, one trailing newline; NaN refused."""
    return (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def stage_records(records: Sequence[tuple[Path, bytes]], *, replace: bool) -> list[StagedFile]:
    """Write each record beside its name (fsynced), not yet in place; on any failure none is left."""
    refuse_existing([p for p, _ in records], replace)  # again: another audit may have written meanwhile
    for folder in {p.parent for p, _ in records}:
        make_folder(folder, "output folder")
    staged: list[StagedFile] = []
    try:
        for p, data in records:
            staged.append(stage_file(p, data))
    except BaseException:
        for file in staged:
            file.discard()
        raise
    return staged


def put_in_place(staged: Sequence[StagedFile], *, replace: bool) -> list[Path]:
    """Keep an existing pair as `.previous` (with `replace`), then rename the new records over it. The old
    record is hard-linked to its `.previous` name first, so a current record exists at every moment."""
    existing = refuse_existing([f.target for f in staged], replace)
    kept = []
    try:
        for p in existing:
            try:
                os.link(p, _previous(p))
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                os.replace(p, _previous(p))  # a filesystem without hard links: moved instead
            kept.append(_previous(p))
    except OSError as e:
        for file in staged:
            file.discard()
        raise output_error(existing[len(kept)], e, "the new records were not put in place") from None
    for file in staged:
        file.commit()
    return kept


def publish(records: Sequence[tuple[Path, bytes]], *, replace: bool) -> list[Path]:
    """Write the records whole (all staged first), then put them in place; return the `.previous` kept."""
    return put_in_place(stage_records(records, replace=replace), replace=replace)


def write_records(
    paths: Sequence[Path],
    docs: Sequence[JSON],
    trust: JSON,
    *,
    replace: bool,
    sealer: Callable[..., JSON] | None = None,
) -> list[Path]:
    """Add `trust` to each record and publish them; with `sealer` (`seals.seal` bound to a ledger and key)
    they are staged, with the signed head, inside the seal's transaction: a disk that cannot take them
    appends no seal. Returns the `.previous` records kept."""
    staged: list[StagedFile] = []

    def write_first(signed: JSON | None) -> None:
        for earlier in staged:  # an attempt that lost a race to another writer
            earlier.discard()
        trust.update({} if signed is None else {"signed_head": signed})
        records = [(p, canonical_bytes(doc | trust)) for p, doc in zip(paths, docs, strict=True)]
        staged[:] = stage_records(records, replace=replace)

    try:
        if sealer is None:
            write_first(None)
        else:
            sealer(before_commit=write_first)
    except BaseException:
        for file in staged:
            file.discard()
        raise
    kept = put_in_place(staged, replace=replace)
    for doc in docs:
        doc.update(trust)
    return kept


def recovery_scenarios() -> list[JSON]:
    """The four failures, each with its stage's trusted state available, through `choose_recovery_action`
    (`required_state`: the state the stage needs; `recovery_state`: the one actually reused)."""
    out = []
    for stage, state in _FAILURE_SCENARIOS:
        failure = {"stage": stage, "available": {state: True}}
        out.append({**choose_recovery_action(failure), "required_state": state, "available": failure["available"]})
    return out


def _error_code(check: JSON) -> str | None:
    error = check.get("error")
    if isinstance(error, str) and error:
        return next((code for text, code in _ERROR_CODES if error.startswith(text)), "unreadable")
    if check.get("verified"):
        return None
    return "hash_mismatch" if check.get("expected") else "no_expected_hash"


def _check_record(path_as_written: Any, evidence: JSON | None, which: str, expected: Any) -> JSON:
    """The evidence's artifact or rollback check in detail: {path, expected, actual, verified, error code}."""
    check = None if evidence is None else evidence[which]
    if check is None:
        return {"path": path_as_written, "expected": expected, "actual": None, "verified": None, "error": "not_checked"}
    return {
        "path": path_as_written,
        "expected": check.get("expected"),
        "actual": check.get("actual"),
        "verified": bool(check.get("verified")),
        "error": _error_code(check),
    }


def _latest_evidence(state: CandidateState, events: Sequence[StoredEvent]) -> tuple[JSON | None, bool]:
    """The newest evidence (payload + seq) and whether it was an inconclusive check: those decide nothing,
    so the state does not keep them; they are found among `events` (the audit's own, for this candidate)."""
    found = [(e, False) for e in (state.last_check, state.last_handoff) if e is not None]
    found += [({**json.loads(e.payload), "seq": e.seq}, True) for e in events if e.type == "InconclusiveCheckRecorded"]
    if not found:
        return None, False
    return max(found, key=lambda pair: int(pair[0]["seq"]))


def _verdicts(evidence: JSON | None, expected: Any, baseline_expected: Any) -> JSON:
    """The source workflow's `evidence` object: the two verdicts and what each compared."""
    artifact = {} if evidence is None else evidence["artifact"]
    rollback = {} if evidence is None else evidence["rollback"]
    return {
        "rollback_ready": bool(rollback.get("verified")),
        "artifact_verified": bool(artifact.get("verified")),
        "artifact_check": {"expected": artifact.get("expected", expected), "actual": artifact.get("actual")},
        "rollback_check": {"expected": rollback.get("expected", baseline_expected), "actual": rollback.get("actual")},
    }


def _hard_failures(evidence: JSON | None, inconclusive: bool, upstream: Any) -> list[str]:
    if evidence is None or inconclusive:  # nothing decided: no check failed, one could not be made
        return []
    if "hard_failures" in evidence:  # a HandoffDecided: the decision as recorded
        return list(evidence["hard_failures"])
    # a (re-)check: the hand-off rule over the recorded evidence, no new I/O
    verdicts = _verdicts(evidence, None, None)
    return list(decide_lifecycle_handoff(cast(str, upstream), evidence["freshness"], verdicts)["hard_failures"])


def candidate_record(
    state: CandidateState,
    *,
    manifest_path: str,
    manifest_sha256: str,
    adapter: JSON,
    baseline_adapter_path: str,
    baseline_sha256: str | None,
    events: Sequence[StoredEvent],
) -> JSON:
    """One candidate as the ledger now says it is, with the evidence of its latest check (`events`: the
    candidate's events this audit appended). A check the environment kept from reading an artifact makes
    `handoff_status` `inconclusive`."""
    fields = state.candidate
    upstream = fields.get("decision")
    evidence, inconclusive = _latest_evidence(state, events)
    freshness = None
    if evidence is not None:
        freshness = {
            "fresh": bool(evidence["freshness"]["fresh"]),
            "failed_checks": list(evidence["freshness"]["failed_checks"]),
        }
    expected = fields.get("adapter_sha256")
    return {
        "path": manifest_path,
        "semantic_id": fields.get("semantic_id"),
        "upstream_decision": upstream,
        "freshness": freshness,
        "artifact": adapter,
        "evidence": _verdicts(evidence, expected, baseline_sha256),
        "handoff_status": "inconclusive" if inconclusive else _HANDOFF_STATUS.get(state.state),
        "hard_failures": _hard_failures(evidence, inconclusive, upstream),
        "inconclusive": list(evidence["inconclusive"]) if inconclusive and evidence is not None else [],
        "candidate_id": state.candidate_id,
        "candidate_kind": state.kind,
        "manifest_path": manifest_path,
        "manifest_sha256": manifest_sha256,
        "artifact_detail": _check_record(fields.get("adapter_path"), evidence, "artifact", expected),
        "rollback_detail": _check_record(baseline_adapter_path, evidence, "rollback", baseline_sha256),
        "reason_codes": list(state.reason_codes),
        "ledger_state": state.state,
        "evidence_seq": None if evidence is None else int(evidence["seq"]),
        "ledger_events": [{"seq": e.seq, "type": e.type} for e in events],
    }
