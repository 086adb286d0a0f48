"""The parts of an explanation (`replay.explain`), typed; `to_json` gives the `explain --json` shapes.

Values read from the log (evidence payloads, settings, what a manifest claimed) stay JSON, shown as recorded.
"""

from __future__ import annotations

from typing import Any

import attrs

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.state import CandidateState
from lifecycle_fsm.store.records import StoredEvent

__all__ = [
    "ArtifactCheck",
    "CheckRow",
    "Considered",
    "DecisiveEvent",
    "Explanation",
    "FileChanges",
    "HashCheck",
    "Invalidation",
    "PathStep",
    "Recovery",
    "RollbackCheck",
]


@attrs.frozen
class PathStep:
    """One event of the candidate and the state it moved the candidate from (None: new) and to."""

    seq: int
    type: str
    trigger: str
    from_state: str | None
    to: str
    recorded_at: str
    actor: str

    def to_json(self) -> JSON:
        return {("from" if k == "from_state" else k): v for k, v in attrs.asdict(self).items()}


@attrs.frozen
class DecisiveEvent:
    """The event that moved the candidate into its state, with its whole payload as evidence."""

    seq: int
    type: str
    version: int
    recorded_at: str
    actor: str
    hash: str
    evidence: JSON

    @classmethod
    def of(cls, event: StoredEvent, payload: JSON) -> DecisiveEvent:
        return cls(event.seq, event.type, event.version, event.recorded_at, event.actor, event.hash, payload)

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen
class CheckRow:
    """One check: passed or not, what the candidate claimed, what it was checked against, and what only
    some checks have (`detail`, shown inline: a hash check's `error`, the upstream check's `reason_codes`)."""

    check: str
    passed: bool
    claimed: Any
    checked_against: Any
    detail: JSON = attrs.Factory(dict)

    def to_json(self) -> JSON:
        found = attrs.asdict(self, recurse=False)
        detail: JSON = found.pop("detail")
        return found | detail


@attrs.frozen
class FileChanges:
    """The files of a folder added, removed or changed since they were recorded; `note` says why not compared."""

    compared: bool
    note: str | None
    added: list[str]
    removed: list[str]
    changed: list[JSON]  # {path, recorded: {size, sha256}, checked: {size, sha256}}

    @classmethod
    def uncompared(cls, note: str) -> FileChanges:
        return cls(False, note, [], [], [])

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen(kw_only=True)
class HashCheck:
    """An adapter re-hashed for a check: the recorded and the actual sha256, and the files that differ."""

    path: Any
    expected: Any
    actual: Any
    verified: Any
    error: Any
    files: FileChanges

    def to_json(self) -> JSON:
        found = attrs.asdict(self, recurse=False)
        files = found.pop("files")  # shown last, after a subclass's fields
        return found | {"files": files.to_json()}


@attrs.frozen(kw_only=True)
class ArtifactCheck(HashCheck):
    """The candidate's adapter, beside how it was at receipt."""

    at_receipt: JSON | None


@attrs.frozen(kw_only=True)
class RollbackCheck(HashCheck):
    """The baseline's adapter, beside how it was when the baseline was activated (at `activated_seq`)."""

    activated_seq: int | None


@attrs.frozen
class Considered:
    """A trusted state a recovery looked at: as the plan saw it (`seen`), and why it was used or passed over."""

    kind: str
    seen: JSON
    outcome: str
    detail: str

    def to_json(self) -> JSON:
        return {"kind": self.kind, **self.seen, "outcome": self.outcome, "detail": self.detail}


@attrs.frozen(kw_only=True)
class Recovery:
    """The latest recovery plan and each trusted state it considered, nearest first."""

    seq: int
    stage: str
    action: str
    recovery_state: str | None
    reused_state: bool
    blocking: bool
    considered: list[Considered]

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False) | {"considered": [c.to_json() for c in self.considered]}


@attrs.frozen
class Invalidation:
    """The setting change that sent a decided candidate back to `received`."""

    seq: int
    cause: str
    previous: Any
    current: Any

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen(kw_only=True)
class Explanation:
    """Why `candidate` is in its state as of seq `as_of`: the decisive event and the evidence behind it."""

    candidate: CandidateState
    as_of: int
    decisive_event: DecisiveEvent
    claimed: JSON
    evidence_seq: int | None
    settings: JSON | None
    checks: list[CheckRow]
    artifact: ArtifactCheck | None
    rollback: RollbackCheck | None
    recovery: Recovery | None
    invalidation: Invalidation | None
    path: list[PathStep]
    stale_rules: JSON | None = None  # the rules the decision was made under, when they are not today's
    inconclusive: JSON | None = None  # the latest check that could not read an artifact, since the decision

    @property
    def last_check_seq(self) -> int | None:
        last = self.candidate.last_check
        return None if last is None else int(last["seq"])

    def to_json(self) -> JSON:
        c = self.candidate
        parts = (self.artifact, self.rollback, self.recovery, self.invalidation)
        artifact, rollback, recovery, invalidation = (None if p is None else p.to_json() for p in parts)
        return {
            "id": c.candidate_id,
            "kind": c.kind,
            "state": str(c.state),
            "version": c.version,
            "revision": c.revision,
            "as_of": self.as_of,
            "reason_codes": list(c.reason_codes),
            "decisive_event": self.decisive_event.to_json(),
            "claimed": self.claimed,
            "manifest": {"path": c.manifest_path, "sha256": c.manifest_sha256},
            "evidence_seq": self.evidence_seq,
            "settings": self.settings,
            "checks": [check.to_json() for check in self.checks],
            "artifact": artifact,
            "rollback": rollback,
            "recovery": recovery,
            "invalidation": invalidation,
            "path": [step.to_json() for step in self.path],
            "last_check_seq": self.last_check_seq,
            "trusted_states": c.trusted_states,
            "stale_rules": self.stale_rules,
            "inconclusive": self.inconclusive,
            "provenance": c.provenance,
            "pending": c.pending,
            "history": [
                {"seq": s.seq, "type": s.type, "recorded_at": s.recorded_at, "actor": s.actor} for s in self.path
            ],
        }
