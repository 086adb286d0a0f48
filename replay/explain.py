"""Why a candidate is where it is, as of any position: the decisive event and the evidence behind it.

Folded from the candidate's own stream (pure, no clock): each check's claimed and checked-against values,
the files that differ, each trusted state a recovery considered, the settings read, the path of states.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from lifecycle_fsm.candidate_events import CANDIDATE_EVENTS
from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.events import LEDGER_STREAM, candidate_id_of, stream_of
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.explanation_parts import (
    ArtifactCheck,
    CheckRow,
    Considered,
    DecisiveEvent,
    Explanation,
    FileChanges,
    Invalidation,
    PathStep,
    Recovery,
    RollbackCheck,
)
from lifecycle_fsm.replay.log import AsOf, not_yet, position_of
from lifecycle_fsm.rules import CANDIDATE_KINDS, ONLINE_KINDS, RECOVERY_STATES_BY_STAGE, UPSTREAM_DECISIONS
from lifecycle_fsm.state import CandidateState, Fold, reading_stored, stale_rules
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.records import StoredEvent
from lifecycle_fsm.upcasting import decoded_payload

# The manifest fields a candidate claims (CandidateReceived.candidate), in the order shown.
CLAIMED_FIELDS = (
    "candidate_kind",
    "semantic_id",
    "source_policy_version",
    "policy_version",
    "evaluation_version",
    "preference_evidence_version",
    "verifier_version",
    "evidence_window_index",
    "decision",
    "adapter_path",
    "adapter_sha256",
)
NON_EMPTY = "a non-empty version string"

# The ledger stream's BaselineActivated events, in seq order: (seq, payload).
Activations = list[tuple[int, JSON]]
Row = tuple[StoredEvent, JSON]  # a stored event and its decoded payload


def baseline_activations(store: EventStore) -> Activations:
    """Every baseline activation, read once (a report explains thousands of candidates against them)."""
    return [(e.seq, decoded_payload(e)) for e in store.read_stream(LEDGER_STREAM) if e.type == "BaselineActivated"]


def explain(store: EventStore, candidate_id: str, *, as_of: AsOf | None = None) -> JSON:
    """`explanation(...)` as the `explain --json` document."""
    return explanation(store, candidate_id, as_of=as_of).to_json()


def explanation(
    store: EventStore, candidate_id: str, *, as_of: AsOf | None = None, activations: Activations | None = None
) -> Explanation:
    """The candidate's state, reason codes, decisive event and evidence as of a position or time (NotFoundError
    when it did not exist yet). `activations`: `baseline_activations(store)`, for a caller explaining many."""
    position = position_of(store, as_of)
    events = [e for e in store.read_stream(stream_of(candidate_id)) if e.seq <= position]
    if not events:
        if as_of is not None:
            raise not_yet(candidate_id, as_of, position)
        raise NotFoundError(f"unknown candidate: {candidate_id!r}", candidate_id=candidate_id)
    rows = [(e, decoded_payload(e)) for e in events]
    state, path = _fold_path(rows)
    by_seq = {e.seq: (e, p) for e, p in rows}
    decisive, decisive_payload = by_seq[state.decisive_seq if state.decisive_seq is not None else events[-1].seq]
    evidence_seq = _evidence_seq(state, decisive)
    shown, evidence = (decisive, None) if evidence_seq is None else by_seq[evidence_seq]
    claimed = {name: state.candidate.get(name) for name in CLAIMED_FIELDS}
    checks: list[CheckRow] = []
    artifact = rollback = None
    # The evidence is read beyond what the fold checked: a field of the wrong shape is that row's corruption.
    with reading_stored(shown.seq, shown.type):
        if evidence is not None:
            checks = _checks(claimed, evidence)
            artifact = _artifact(evidence["artifact"], rows, shown.seq)
            found = activations if activations is not None else baseline_activations(store)
            rollback = _rollback(found, evidence["rollback"], shown.seq)
        recovery = _recovery(state.last_recovery, path, by_seq)
        invalidation = _invalidation(decisive, decisive_payload)
    header = (decisive.seq, decisive.type, decisive.version, decisive.recorded_at, decisive.actor, decisive.hash)
    return Explanation(
        candidate=state,
        as_of=position,
        decisive_event=DecisiveEvent(*header, decisive_payload),
        claimed=claimed,
        evidence_seq=evidence_seq,
        settings=None if evidence is None else evidence.get("settings"),
        checks=checks,
        artifact=artifact,
        rollback=rollback,
        recovery=recovery,
        invalidation=invalidation,
        path=path,
        stale_rules=stale_rules(state),
        inconclusive=_inconclusive(rows, decisive.seq),
    )


def _fold_path(rows: Sequence[Row]) -> tuple[CandidateState, list[PathStep]]:
    """The candidate after its events (the one fold), and the state each event moved it from and to."""
    folding = Fold()
    path = []
    for e, payload in rows:
        work = folding.work(e.stream_id)
        before = None if work is None else str(work["state"])
        # The fold first: it judges the row (fields, types, the move) before anything else reads it.
        folding.add((e.seq, e.stream_id, e.version, e.type, e.schema_version, e.payload))
        with reading_stored(e.seq, e.type):
            trigger = CANDIDATE_EVENTS[e.type].trigger_for(payload)
        after = folding.work(e.stream_id)
        assert after is not None
        path.append(PathStep(e.seq, e.type, trigger, before, str(after["state"]), e.recorded_at, e.actor))
    return folding.result().candidates[candidate_id_of(rows[0][0].stream_id) or ""], path


def _evidence_seq(state: CandidateState, decisive: StoredEvent) -> int | None:
    """The check whose evidence explains the state: the decisive one, else the latest check or hand-off."""
    if decisive.type in ("ChecksRecorded", "HandoffDecided"):
        return decisive.seq
    seqs = [d["seq"] for d in (state.last_check, state.last_handoff) if d is not None]
    return max(seqs, default=None)


def _passed(name: str, evidence: JSON) -> bool:
    return name not in evidence.get("reason_codes", ()) and name not in evidence["freshness"].get("failed_checks", ())


def _branch(claimed: JSON, settings: JSON) -> tuple[Any, Any]:
    """What `branch_evidence` read of the candidate, and what it held it to: it depends on the kind."""
    kind = claimed["candidate_kind"]
    if kind == "dpo":
        return {"preference_evidence_version": claimed["preference_evidence_version"]}, NON_EMPTY
    if kind in ONLINE_KINDS:
        against: JSON = {"verifier_version": NON_EMPTY}
        against |= {k: settings.get(k) for k in ("active_window", "window_age", "max_window_age")}
        return {k: claimed[k] for k in ("verifier_version", "evidence_window_index")}, against
    fields = ("preference_evidence_version", "verifier_version", "evidence_window_index")
    return {k: claimed[k] for k in fields}, f"a known candidate kind ({', '.join(CANDIDATE_KINDS)})"


def _checks(claimed: JSON, evidence: JSON) -> list[CheckRow]:
    """Each check: what the candidate claimed beside what it was checked against (the recorded settings)."""
    settings = evidence.get("settings") or {}
    active_eval = settings.get("evaluation_version")
    rows = [
        ("candidate_kind", claimed["candidate_kind"], f"one of {', '.join(CANDIDATE_KINDS)}"),
        ("source_policy", claimed["source_policy_version"], settings.get("active_policy_version")),
        ("candidate_identity", claimed["policy_version"], NON_EMPTY),
        ("evaluation_identity", claimed["evaluation_version"], NON_EMPTY if active_eval is None else active_eval),
        ("branch_evidence", *_branch(claimed, settings)),
    ]
    out = [CheckRow(name, _passed(name, evidence), claim, against) for name, claim, against in rows]
    for name in ("artifact", "rollback"):
        check = evidence[name]
        detail = {"error": check.get("error")}
        out.append(CheckRow(name, bool(check.get("verified")), check.get("expected"), check.get("actual"), detail))
    if "upstream_decision" in evidence:  # a hand-off: the upstream decision is checked too
        failed = [c for c in evidence.get("hard_failures", ()) if c in ("upstream_reject", "upstream_state")]
        against = f"one of {', '.join(UPSTREAM_DECISIONS)}; reject fails"
        out.append(CheckRow("upstream", not failed, evidence["upstream_decision"], against, {"reason_codes": failed}))
    return out


def file_changes(before: JSON | None, after: JSON | None) -> FileChanges:
    """Files added, removed or changed between two per-file listings (`TreeDigest.to_json`), if both have one."""
    for side, tree in (("recorded", before), ("checked", after)):
        if tree is None:
            why = "a single file, unreadable, or recorded before per-file digests"
            return FileChanges(False, f"no per-file digests {side} ({why})", [], [], [])
        if tree.get("files") is None:
            note = f"{tree.get('count')} files: above the listing cap, only the tree hashes are compared"
            return FileChanges(False, note, [], [], [])
    assert before is not None
    assert after is not None
    old = {f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in before["files"]}
    new = {f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in after["files"]}
    changed = [
        {"path": p, "recorded": old[p], "checked": new[p]} for p in sorted(old.keys() & new.keys()) if old[p] != new[p]
    ]
    return FileChanges(True, None, sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys()), changed)


def _hashes(check: JSON) -> JSON:
    return {k: check.get(k) for k in ("path", "expected", "actual", "verified", "error")}


def _artifact(check: JSON, rows: Sequence[Row], upto: int) -> ArtifactCheck:
    """The candidate's adapter: the hashes, and which files differ from those recorded at its latest receipt."""
    received = [p for e, p in rows if e.type == "CandidateReceived" and e.seq <= upto]
    receipt = received[-1]["artifact_at_receipt"] if received else None  # None: not recorded then
    at_receipt = None if receipt is None else {k: receipt.get(k) for k in ("actual", "error")}
    files = file_changes(None if receipt is None else receipt.get("tree"), check.get("tree"))
    return ArtifactCheck(**_hashes(check), at_receipt=at_receipt, files=files)


def _rollback(activations: Activations, check: JSON, upto: int) -> RollbackCheck:
    """The baseline's adapter: the hashes, and which files differ from those recorded at its last activation."""
    found = bisect_right(activations, upto, key=lambda a: a[0])
    activated = activations[found - 1] if found else None
    files = file_changes(None if activated is None else activated[1]["adapter_tree"], check.get("tree"))
    return RollbackCheck(**_hashes(check), activated_seq=None if activated is None else activated[0], files=files)


def _recovery(plan: JSON | None, path: list[PathStep], by_seq: dict[int, Row]) -> Recovery | None:
    """The latest recovery plan and every trusted state it considered, nearest first, with why it was passed over."""
    if plan is None:
        return None
    order = RECOVERY_STATES_BY_STAGE.get(plan["stage"], tuple(sorted(plan["trusted_states"])))
    considered = []
    for kind in order:
        seen = plan["trusted_states"].get(kind)
        if seen is not None:
            considered.append(Considered(kind, seen, *_outcome(kind, seen, plan, path, by_seq)))
    fields = ("seq", "stage", "action", "recovery_state", "reused_state", "blocking")
    return Recovery(**{k: plan[k] for k in fields}, considered=considered)


def _outcome(kind: str, seen: JSON, plan: JSON, path: list[PathStep], by_seq: dict[int, Row]) -> tuple[str, str]:
    """used, not_needed (a nearer state was used), or why it was passed over, with a detail."""
    if kind == plan["recovery_state"]:
        return "used", f"re-hashed {seen.get('actual')}, as recorded"
    if seen.get("available"):
        return "not_needed", f"intact, but {plan['recovery_state']} comes first"
    if seen.get("source") is None:  # nothing recorded at plan time: invalidated since (and when), or never
        for step in reversed([s for s in path if s.seq < plan["seq"]]):
            payload = by_seq[step.seq][1]
            if step.type == "TrustedStateInvalidated" and payload["kind"] == kind:
                return "invalidated", f"invalidated at seq {step.seq} ({payload['reason']})"
            if step.type == "TrustedStateRecorded" and payload["kind"] == kind:
                break
        return "not_recorded", "never recorded for this candidate"
    if seen.get("actual") is None:
        return "missing", str(seen.get("error"))
    return "hash_changed", f"recorded {seen.get('expected')}, now {seen.get('actual')}"


def _invalidation(decisive: StoredEvent, payload: JSON) -> Invalidation | None:
    if decisive.type != "EvidenceInvalidated":
        return None
    return Invalidation(decisive.seq, payload["cause"], payload["previous"], payload["current"])


def _inconclusive(rows: Sequence[Row], after: int) -> JSON | None:
    """The latest check or hand-off after the decisive event that could not read an artifact: what and why."""
    found = [(e, p) for e, p in rows if e.type == "InconclusiveCheckRecorded" and e.seq > after]
    if not found:
        return None
    event, payload = found[-1]
    with reading_stored(event.seq, event.type):
        why = {name: payload[name]["error"] for name in payload["inconclusive"]}
        return {"seq": event.seq, "command": payload["command"], "checks": why}
