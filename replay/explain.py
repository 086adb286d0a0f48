"""Why a candidate is where it is: the decisive event and all the evidence behind it, at any position.

An auditor asks "why was this rejected?" months later. The answer is folded from the
candidate's own stream up to a position (pure, no clock) and says:
- the decisive event (seq, type, who recorded it, when) and the reason codes;
- every check: what the candidate claimed (manifest fields) beside what it was
  checked against (the settings recorded with the check), and whether it passed;
- for an artifact or rollback folder, which files were added, removed or changed
  since the digests recorded at receipt (or at the baseline's activation);
- for a recovery, each trusted state it considered and why it was passed over;
- the settings the decision read, and the path of states that led here.
`explain_text.py` renders the same document as text or Markdown.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.events import CANDIDATE_EVENTS, LEDGER_STREAM, stream_of
from lifecycle_fsm.replay.asof import AsOf, position_of
from lifecycle_fsm.rules import CANDIDATE_KINDS, ONLINE_KINDS, RECOVERY_STATES_BY_STAGE, UPSTREAM_DECISIONS
from lifecycle_fsm.state import CandidateState, Fold, reading_stored
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.records import StoredEvent
from lifecycle_fsm.upcasting import decoded_payload

__all__ = ["CLAIMED_FIELDS", "baseline_activations", "explain", "file_changes"]

JSON = dict[str, Any]
# The manifest fields a candidate claims (CandidateReceived.candidate), in the order shown.
CLAIMED_FIELDS = (
    "candidate_kind", "semantic_id", "source_policy_version", "policy_version", "evaluation_version",
    "preference_evidence_version", "verifier_version", "evidence_window_index", "decision", "adapter_path",
    "adapter_sha256",
)  # fmt: skip
NON_EMPTY = "a non-empty version string"


def _event_json(event: StoredEvent, payload: JSON) -> JSON:
    return {
        "seq": event.seq,
        "type": event.type,
        "version": event.version,
        "recorded_at": event.recorded_at,
        "actor": event.actor,
        "hash": event.hash,
        "evidence": payload,
    }


# The ledger stream's BaselineActivated events, in seq order: (seq, payload).
Activations = list[tuple[int, JSON]]


def baseline_activations(store: EventStore) -> Activations:
    """Every baseline activation, read once (a report explains thousands of candidates against them)."""
    return [(e.seq, decoded_payload(e)) for e in store.read_stream(LEDGER_STREAM) if e.type == "BaselineActivated"]


def explain(
    store: EventStore, candidate_id: str, *, as_of: AsOf | None = None, activations: Activations | None = None
) -> JSON:
    """The candidate's state, reason codes, decisive event and evidence as of a position or time.

    `activations`: `baseline_activations(store)` when the caller explains many candidates in one
    snapshot (read here when needed otherwise). Raises InputError for a seq past the head,
    NotFoundError when the candidate did not exist yet at that position.
    """
    position = position_of(store, as_of)
    events = [e for e in store.read_stream(stream_of(candidate_id)) if e.seq <= position]
    if not events:
        where = "" if as_of is None else f" at or before seq {position}"
        raise NotFoundError(f"unknown candidate: {candidate_id!r}{where}")
    payloads = [decoded_payload(e) for e in events]
    folding = Fold()
    path = []
    for e, payload in zip(events, payloads, strict=True):
        work = folding.work(e.stream_id)
        before = None if work is None else str(work["state"])
        # The fold first: it judges the row (fields, types, the move) before anything else reads it.
        folding.add((e.seq, e.stream_id, e.version, e.type, e.schema_version, e.payload))
        with reading_stored(e.seq, e.type):
            trigger = CANDIDATE_EVENTS[e.type].trigger_for(payload)
        after = folding.work(e.stream_id)
        assert after is not None
        path.append({"seq": e.seq, "type": e.type, "trigger": trigger, "from": before, "to": str(after["state"]),
                     "recorded_at": e.recorded_at, "actor": e.actor})  # fmt: skip
    state = folding.result().candidates[candidate_id]
    by_seq = {e.seq: (e, p) for e, p in zip(events, payloads, strict=True)}
    decisive, decisive_payload = by_seq[state.decisive_seq if state.decisive_seq is not None else events[-1].seq]
    evidence_seq = _evidence_seq(state, decisive)
    evidence = None if evidence_seq is None else by_seq[evidence_seq][1]
    receipt = _receipt(events, payloads, evidence_seq or decisive.seq)
    claimed = {name: state.candidate.get(name) for name in CLAIMED_FIELDS}
    # The evidence is read beyond what the fold checked: a field of the wrong shape is that row's corruption.
    shown = by_seq[evidence_seq][0] if evidence_seq is not None else decisive
    with reading_stored(shown.seq, shown.type):
        checks = [] if evidence is None else _checks(claimed, evidence)
        artifact = None if evidence is None else _artifact(evidence["artifact"], receipt)
        rollback = (
            None
            if evidence is None
            else _rollback(
                baseline_activations(store) if activations is None else activations,
                evidence["rollback"],
                evidence_seq or 0,
            )
        )
        recovery = _recovery(state.last_recovery, path, by_seq)
        invalidation = _invalidation(decisive, decisive_payload)
    doc: JSON = {
        "id": state.candidate_id,
        "kind": state.kind,
        "state": state.state,
        "version": state.version,
        "revision": state.revision,
        "as_of": position,
        "reason_codes": list(state.reason_codes),
        "decisive_event": _event_json(decisive, decisive_payload),
        "claimed": claimed,
        "manifest": {"path": state.manifest_path, "sha256": state.manifest_sha256},
        "evidence_seq": evidence_seq,
        "settings": None if evidence is None else evidence.get("settings"),
        "checks": checks,
        "artifact": artifact,
        "rollback": rollback,
        "recovery": recovery,
        "invalidation": invalidation,
        "path": path,
        "last_check_seq": None if state.last_check is None else state.last_check["seq"],
        "trusted_states": state.trusted_states,
        "history": [{"seq": e.seq, "type": e.type, "recorded_at": e.recorded_at, "actor": e.actor} for e in events],
    }
    return doc


def _evidence_seq(state: CandidateState, decisive: StoredEvent) -> int | None:
    """The check whose evidence explains the state: the decisive one, else the latest check or hand-off."""
    if decisive.type in ("ChecksRecorded", "HandoffDecided"):
        return decisive.seq
    seqs = [d["seq"] for d in (state.last_check, state.last_handoff) if d is not None]
    return max(seqs, default=None)


def _receipt(events: list[StoredEvent], payloads: list[JSON], upto: int) -> JSON | None:
    """The artifact as it was at the latest receipt before `upto` (None: not recorded then)."""
    received = [p for e, p in zip(events, payloads, strict=True) if e.type == "CandidateReceived" and e.seq <= upto]
    return received[-1]["artifact_at_receipt"] if received else None


def _passed(name: str, evidence: JSON) -> bool:
    return name not in evidence.get("reason_codes", ()) and name not in evidence["freshness"].get("failed_checks", ())


def _checks(claimed: JSON, evidence: JSON) -> list[JSON]:
    """Each check: what the candidate claimed beside what it was checked against (the recorded settings)."""
    s = evidence.get("settings") or {}
    kind = claimed["candidate_kind"]
    active_eval = s.get("evaluation_version")
    if kind == "dpo":
        branch_claimed: Any = {"preference_evidence_version": claimed["preference_evidence_version"]}
        branch_against: Any = NON_EMPTY
    elif kind in ONLINE_KINDS:
        branch_claimed = {"verifier_version": claimed["verifier_version"],
                          "evidence_window_index": claimed["evidence_window_index"]}  # fmt: skip
        branch_against = {"verifier_version": NON_EMPTY, "active_window": s.get("active_window"),
                          "window_age": s.get("window_age"), "max_window_age": s.get("max_window_age")}  # fmt: skip
    else:
        branch_claimed = {k: claimed[k] for k in ("preference_evidence_version", "verifier_version",
                                                  "evidence_window_index")}  # fmt: skip
        branch_against = f"a known candidate kind ({', '.join(CANDIDATE_KINDS)})"
    rows = [
        ("candidate_kind", kind, f"one of {', '.join(CANDIDATE_KINDS)}"),
        ("source_policy", claimed["source_policy_version"], s.get("active_policy_version")),
        ("candidate_identity", claimed["policy_version"], NON_EMPTY),
        ("evaluation_identity", claimed["evaluation_version"], active_eval if active_eval is not None else NON_EMPTY),
        ("branch_evidence", branch_claimed, branch_against),
    ]
    out = [{"check": n, "passed": _passed(n, evidence), "claimed": c, "checked_against": a} for n, c, a in rows]
    for name in ("artifact", "rollback"):
        check = evidence[name]
        out.append({"check": name, "passed": bool(check.get("verified")), "claimed": check.get("expected"),
                    "checked_against": check.get("actual"), "error": check.get("error")})  # fmt: skip
    if "upstream_decision" in evidence:  # a hand-off: the upstream decision is checked too
        upstream = evidence["upstream_decision"]
        failed = [c for c in evidence.get("hard_failures", ()) if c in ("upstream_reject", "upstream_state")]
        out.append({"check": "upstream", "passed": not failed, "claimed": upstream,
                    "checked_against": f"one of {', '.join(UPSTREAM_DECISIONS)}; reject fails",
                    "reason_codes": failed})  # fmt: skip
    return out


def file_changes(before: JSON | None, after: JSON | None) -> JSON:
    """Files added, removed or changed between two per-file listings (`TreeDigest.to_json`).

    `compared` is False (with `note`) when either side has no listing to compare.
    """
    for side, tree in (("recorded", before), ("checked", after)):
        if tree is None:
            return {"compared": False, "note": f"no per-file digests {side} (a single file, unreadable, or "
                    "recorded before per-file digests)", "added": [], "removed": [], "changed": []}  # fmt: skip
        if tree.get("files") is None:
            return {"compared": False, "note": f"{tree.get('count')} files: above the listing cap, only the tree "
                    "hashes are compared", "added": [], "removed": [], "changed": []}  # fmt: skip
    assert before is not None
    assert after is not None
    old = {f["path"]: f for f in before["files"]}
    new = {f["path"]: f for f in after["files"]}
    changed = [
        {"path": p, "recorded": {"size": old[p]["size"], "sha256": old[p]["sha256"]},
         "checked": {"size": new[p]["size"], "sha256": new[p]["sha256"]}}
        for p in sorted(old.keys() & new.keys())
        if (old[p]["size"], old[p]["sha256"]) != (new[p]["size"], new[p]["sha256"])
    ]  # fmt: skip
    return {"compared": True, "note": None, "added": sorted(new.keys() - old.keys()),
            "removed": sorted(old.keys() - new.keys()), "changed": changed}  # fmt: skip


def _artifact(check: JSON, receipt: JSON | None) -> JSON:
    """The candidate's adapter: the hashes, and which files differ from those recorded at receipt."""
    return {
        **{k: check.get(k) for k in ("path", "expected", "actual", "verified", "error")},
        "at_receipt": None if receipt is None else {k: receipt.get(k) for k in ("actual", "error")},
        "files": file_changes(None if receipt is None else receipt.get("tree"), check.get("tree")),
    }


def _rollback(activations: Activations, check: JSON, upto: int) -> JSON:
    """The baseline's adapter: the hashes, and which files differ from those recorded at its activation
    (the last activation at or before `upto`)."""
    found = bisect_right(activations, upto, key=lambda a: a[0])
    activated = activations[found - 1] if found else None
    return {
        **{k: check.get(k) for k in ("path", "expected", "actual", "verified", "error")},
        "activated_seq": None if activated is None else activated[0],
        "files": file_changes(None if activated is None else activated[1]["adapter_tree"], check.get("tree")),
    }


def _recovery(plan: JSON | None, path: list[JSON], by_seq: dict[int, tuple[StoredEvent, JSON]]) -> JSON | None:
    """The latest recovery plan and every trusted state it considered, nearest first, with why it was passed over."""
    if plan is None:
        return None
    order = RECOVERY_STATES_BY_STAGE.get(plan["stage"], tuple(sorted(plan["trusted_states"])))
    considered = []
    for kind in order:
        seen = plan["trusted_states"].get(kind)
        if seen is None:
            continue
        outcome, detail = _outcome(kind, seen, plan, path, by_seq)
        considered.append({"kind": kind, **seen, "outcome": outcome, "detail": detail})
    return {**{k: plan[k] for k in ("seq", "stage", "action", "recovery_state", "reused_state", "blocking")},
            "considered": considered}  # fmt: skip


def _outcome(
    kind: str, seen: JSON, plan: JSON, path: list[JSON], by_seq: dict[int, tuple[StoredEvent, JSON]]
) -> tuple[str, str]:
    """used, not_needed (a nearer state was used), or why it was passed over (SPEC §10's reasons), with a detail."""
    if kind == plan["recovery_state"]:
        return "used", f"re-hashed {seen.get('actual')}, as recorded"
    if seen.get("available"):
        return "not_needed", f"intact, but {plan['recovery_state']} comes first"
    if seen.get("source") is None:  # nothing recorded at plan time: never recorded, or invalidated since
        for step in reversed([s for s in path if s["seq"] < plan["seq"]]):
            payload = by_seq[step["seq"]][1]
            if step["type"] == "TrustedStateInvalidated" and payload["kind"] == kind:
                return "invalidated", f"invalidated at seq {step['seq']} ({payload['reason']})"
            if step["type"] == "TrustedStateRecorded" and payload["kind"] == kind:
                break
        return "not_recorded", "never recorded for this candidate"
    if seen.get("actual") is None:
        return "missing", str(seen.get("error"))
    return "hash_changed", f"recorded {seen.get('expected')}, now {seen.get('actual')}"


def _invalidation(decisive: StoredEvent, payload: JSON) -> JSON | None:
    if decisive.type != "EvidenceInvalidated":
        return None
    return {"seq": decisive.seq, **{k: payload[k] for k in ("cause", "previous", "current")}}
