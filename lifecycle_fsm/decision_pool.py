"""The decision pool: every recorded decision as a file of what the decider saw and what it decided.

`export_pool` writes one JSON file per check, hand-off and recovery plan; `replay_pool` re-decides
each with today's rules and lists those that would change (run it before merging a rules change).
Files are strict (an unknown or missing key is named) and canonical: `from_json(text).to_json() == text`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.checks import FRESHNESS_FIELDS, ArtifactCheck, CheckEvidence, freshness
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.events import candidate_id_of
from lifecycle_fsm.folders import make_folder
from lifecycle_fsm.json_types import JSON, KeyGivenTwice, strict_loads
from lifecycle_fsm.limits import MAX_MANIFEST_BYTES, read_regular_file
from lifecycle_fsm.outputs import write_atomic
from lifecycle_fsm.rules import STAGES, choose_recovery_action
from lifecycle_fsm.state import CandidateState, LedgerSettings, reading_stored
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.streams import fold_candidate
from lifecycle_fsm.upcasting import decoded_payload

SCHEMA = "lifecycle-decision-pool/v1"
_CANDIDATE_FIELDS = (*FRESHNESS_FIELDS, "evidence_window_index")
_SETTINGS_FIELDS = ("active_policy_version", "active_window", "max_window_age", "evaluation_version")
_EVIDENCE_FIELDS = ("candidate", "settings", "artifact_verified", "rollback_verified", "path_escapes_root")
# Every key a file holds, per decision: inputs (what the decider saw) and decided (what it said).
_INPUT_KEYS = {
    "check": _EVIDENCE_FIELDS,
    "handoff": (*_EVIDENCE_FIELDS, "upstream_decision"),
    "recovery": ("stage", "available"),
}
_DECIDED_KEYS = {
    "check": ("passed", "reason_codes"),
    "handoff": ("handoff_status", "hard_failures"),
    "recovery": ("action", "recovery_state", "reused_state"),
}
_TOP_KEYS = ("schema", "decision", "candidate_id", "seq", "event_type", "inputs", "decided")
_NESTED = {"candidate": _CANDIDATE_FIELDS, "settings": _SETTINGS_FIELDS}
# Keys a file may lack: ones added to the format after files were written (read as null).
_OPTIONAL = frozenset({"inputs.candidate.semantic_id"})


class DecisionPoolError(InputError):
    """A pool file that is not exactly a decision (unknown or missing key, wrong schema)."""


@attrs.frozen
class DecisionState:
    """One recorded decision: its inputs and its outcome, as the ledger stored them."""

    decision: str  # check, handoff, recovery
    candidate_id: str
    seq: int
    event_type: str
    inputs: JSON
    decided: JSON

    def to_json(self) -> str:
        doc = {"schema": SCHEMA, **attrs.asdict(self)}
        return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "<text>") -> DecisionState:
        try:
            doc = strict_loads(text)
        except KeyGivenTwice as e:
            raise DecisionPoolError(f"{source}: {e}") from None
        except ValueError as e:
            raise DecisionPoolError(f"{source}: not JSON ({e})") from None
        _exact(source, "", doc, _TOP_KEYS)
        if doc["schema"] != SCHEMA:
            raise DecisionPoolError(f"{source}: key 'schema': {doc['schema']!r} is not {SCHEMA!r}")
        kind = doc["decision"]
        if kind not in _INPUT_KEYS:
            raise DecisionPoolError(f"{source}: key 'decision': {kind!r} is not one of {', '.join(_INPUT_KEYS)}")
        _exact(source, "inputs.", doc["inputs"], _INPUT_KEYS[kind])
        _exact(source, "decided.", doc["decided"], _DECIDED_KEYS[kind])
        for key, fields in _NESTED.items():
            if key in doc["inputs"]:
                _exact(source, f"inputs.{key}.", doc["inputs"][key], fields)
        if isinstance(doc["seq"], bool) or not isinstance(doc["seq"], int) or not isinstance(doc["candidate_id"], str):
            raise DecisionPoolError(f"{source}: keys 'seq' and 'candidate_id' must be an integer and a string")
        if not isinstance(doc["event_type"], str):
            raise DecisionPoolError(f"{source}: key 'event_type': {doc['event_type']!r} is not a string")
        _check_values(source, kind, doc["inputs"])
        return cls(kind, doc["candidate_id"], doc["seq"], doc["event_type"], doc["inputs"], doc["decided"])


def _exact(source: str, where: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise DecisionPoolError(f"{source}: {where.rstrip('.') or 'the file'} must be an object")
    for key in value:
        if key not in keys:
            raise DecisionPoolError(f"{source}: unknown key {where}{key!r} (expected {', '.join(keys)})")
    for key in keys:
        if key not in value and f"{where}{key}" not in _OPTIONAL:
            raise DecisionPoolError(f"{source}: missing key {where}{key!r}")


def _check_values(source: str, kind: str, inputs: JSON) -> None:
    """The inputs the deciders compute with have the types they take: a bad one is bad input, not a traceback
    (candidate fields and the upstream decision are what the rules judge: not checked here)."""

    def bad(key: str, what: str) -> DecisionPoolError:
        return DecisionPoolError(f"{source}: key inputs.{key}: {what}")

    if kind == "recovery":
        if not isinstance(inputs["stage"], str) or inputs["stage"] not in STAGES:
            raise bad("stage", f"{inputs['stage']!r} is not one of {', '.join(STAGES)}")
        available = inputs["available"]
        if not isinstance(available, dict) or not all(isinstance(v, bool) for v in available.values()):
            raise bad("available", "must be an object of trusted-state kinds to true or false")
        return
    settings = inputs["settings"]
    for key in ("active_window", "max_window_age"):
        value = settings[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise bad(f"settings.{key}", f"{value!r} is not an integer from 0 or null")  # as `init` takes them
    for key in ("active_policy_version", "evaluation_version"):
        if settings[key] is not None and not isinstance(settings[key], str):
            raise bad(f"settings.{key}", f"{settings[key]!r} is not a string or null")
    for key in ("artifact_verified", "rollback_verified", "path_escapes_root"):
        if not isinstance(inputs[key], bool):
            raise bad(key, f"{inputs[key]!r} is not true or false")


def _evidence(state: CandidateState, payload: JSON) -> JSON:
    settings = payload["settings"]
    return {
        "candidate": {k: state.candidate.get(k) for k in _CANDIDATE_FIELDS},
        "settings": {k: settings.get(k) for k in _SETTINGS_FIELDS},
        "artifact_verified": bool(payload["artifact"]["verified"]),
        "rollback_verified": bool(payload["rollback"]["verified"]),
        "path_escapes_root": "path_escapes_root" in payload["reason_codes"],
    }


def _decision(state: CandidateState | None, seq: int, event_type: str, payload: JSON) -> DecisionState | None:
    if state is None:
        return None
    cid = state.candidate_id
    if event_type == "ChecksRecorded":
        decided = {"passed": payload["passed"], "reason_codes": list(payload["reason_codes"])}
        return DecisionState("check", cid, seq, event_type, _evidence(state, payload), decided)
    if event_type == "HandoffDecided":
        inputs = _evidence(state, payload) | {"upstream_decision": payload["upstream_decision"]}
        decided = {"handoff_status": payload["handoff_status"], "hard_failures": list(payload["hard_failures"])}
        return DecisionState("handoff", cid, seq, event_type, inputs, decided)
    if event_type == "RecoveryPlanned":
        available = {kind: bool(t["available"]) for kind, t in payload["trusted_states"].items()}
        inputs = {"stage": payload["stage"], "available": available}
        return DecisionState(
            "recovery", cid, seq, event_type, inputs, {k: payload[k] for k in _DECIDED_KEYS["recovery"]}
        )
    return None


def _decisions(store: EventStore) -> Iterator[DecisionState]:
    """Every recorded decision, candidate by candidate, in log order within each."""
    for head in store.streams():
        cid = candidate_id_of(head.stream_id)
        if cid is None:
            continue
        state: CandidateState | None = None
        for e in store.read_stream(head.stream_id):
            payload = decoded_payload(e)
            # The fold first (it judges the row); then the decision's inputs, read beyond what the fold reads.
            after = fold_candidate([e], start=state)
            with reading_stored(e.seq, e.type):
                found = _decision(state, e.seq, e.type, payload)
            if found is not None:
                yield found
            state = after


def export_pool(store: EventStore, folder: Path) -> list[Path]:
    """One file per decision in `folder`, which must be new or empty (a pool is never merged into)."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InputError(f"{folder} is not an empty folder: a decision pool is written into a new one")
    decisions = sorted(_decisions(store), key=lambda d: d.seq)  # read first: a log it cannot trust makes no folder
    created = not folder.exists()
    make_folder(folder, "decision pool folder")
    written: list[Path] = []
    try:
        for d in decisions:
            path = folder / f"{d.seq:08d}-{d.decision}.json"
            written.append(write_atomic(path, d.to_json().encode(), what="no decision file was kept"))
    except BaseException:
        for path in written:  # a pool is whole or absent: a partial one would replay as if it were all
            path.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return written


@attrs.frozen
class Changed:
    """A decision today's rules would make differently."""

    file: str
    state: DecisionState
    now: JSON

    def line(self) -> str:
        recorded, now = json.dumps(self.state.decided, sort_keys=True), json.dumps(self.now, sort_keys=True)
        return f"{self.state.candidate_id} seq {self.state.seq} ({self.state.decision}): recorded {recorded}, now {now}"


def _redecide(d: DecisionState) -> JSON:
    """What today's rules decide from the same inputs."""
    if d.decision == "recovery":
        plan = choose_recovery_action({"stage": d.inputs["stage"], "available": d.inputs["available"]})
        return {k: plan[k] for k in _DECIDED_KEYS["recovery"]}
    s = d.inputs["settings"]
    settings = LedgerSettings(
        initialized=True,
        max_window_age=s["max_window_age"],
        active_window=s["active_window"],
        baseline=None if s["active_policy_version"] is None else {"policy_version": s["active_policy_version"]},
        evaluation_version=s["evaluation_version"],
    )
    escaped = "path_escapes_root" if d.inputs["path_escapes_root"] else None
    evidence = CheckEvidence(  # the check's own rules, over the evidence the file recorded
        freshness(d.inputs["candidate"], settings),
        ArtifactCheck(None, None, verified=d.inputs["artifact_verified"], error=escaped),
        ArtifactCheck(None, None, verified=d.inputs["rollback_verified"]),
        settings={},
    )
    if d.decision == "check":
        reasons = evidence.reason_codes
        return {"passed": not reasons, "reason_codes": reasons}
    decision = evidence.decide(d.inputs["upstream_decision"])[0]
    return {"handoff_status": decision["handoff_status"], "hard_failures": decision["hard_failures"]}


def read_pool(folder: Path) -> list[tuple[str, DecisionState]]:
    """Every `*.json` under the folder (sub-folders too), strictly parsed, each named by its path in the
    folder; the first bad file raises, naming file and key. An empty folder is an empty pool."""
    if not folder.is_dir():
        raise InputError(f"{folder}: no such decision pool folder")
    out = []
    for f in sorted(folder.rglob("*.json")):
        try:  # regular files only, bounded: a FIFO or a link to /dev/zero named *.json never hangs it
            text = read_regular_file(f, what="decision file", limit=MAX_MANIFEST_BYTES).decode("utf-8")
        except (InputError, UnicodeDecodeError) as e:
            raise DecisionPoolError(f"{f}: cannot read ({e})") from None
        out.append((f.relative_to(folder).as_posix(), DecisionState.from_json(text, source=str(f))))
    return out


def replay_pool(folder: Path) -> tuple[int, list[Changed]]:
    """How many decisions were re-decided, and those that would change."""
    pool = read_pool(folder)
    changed = [Changed(name, d, now) for name, d in pool if (now := _redecide(d)) != d.decided]
    return len(pool), changed
