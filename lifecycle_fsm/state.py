"""State as a fold of events: `apply(state, event) -> state`, pure and total.

No callbacks, no I/O, no clock: the same events give the same state on any machine.
Every candidate event is checked against the machine's `TABLE`; an illegal move is
an `IllegalTransition` naming the seq, what the table allows there, and what was
found. The fold works on payload dicts (replay never builds event objects) and the
typed `apply` is a thin wrapper over the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import EVENT_TYPES, LEDGER_STREAM, Event, candidate_id_of, stream_of
from lifecycle_fsm.machine import allowed_triggers, next_state

__all__ = [
    "CandidateState",
    "IllegalTransition",
    "LedgerSettings",
    "apply",
    "apply_candidate",
    "apply_settings",
    "candidate_from_dict",
    "settings_from_dict",
]

JSON = dict[str, Any]


class IllegalTransition(CorruptionError):
    """A recorded event makes a move the machine's table does not allow."""

    def __init__(self, *, seq: int | None, stream_id: str, state: str | None, trigger: str, type_name: str) -> None:
        allowed = allowed_triggers(state)
        super().__init__(
            f"seq {seq}: {type_name} ({trigger}) is not allowed from state {state or 'none'}; "
            f"the table allows {', '.join(allowed) or 'nothing (terminal)'}",
            seq=seq,
            stream_id=stream_id,
            state=state,
            found=trigger,
            allowed=allowed,
        )
        self.state = state
        self.trigger = trigger
        self.allowed = allowed


@attrs.frozen
class LedgerSettings:
    """What every check reads: the active baseline, window and evaluation version."""

    initialized: bool = False
    max_window_age: int | None = None
    active_window: int | None = None
    baseline: JSON | None = None  # the BaselineActivated payload
    evaluation_version: str | None = None
    version: int = 0  # the ledger stream's version these settings were folded from
    last_seq: int = 0

    @property
    def active_policy_version(self) -> str | None:
        return None if self.baseline is None else str(self.baseline["policy_version"])


@attrs.frozen
class CandidateState:
    """One candidate as the log says it is now."""

    candidate_id: str
    state: str
    version: int
    last_seq: int
    kind: str | None
    candidate: JSON  # parsed manifest fields (CandidateReceived.candidate)
    manifest_path: str
    revision: int = 0
    trusted_states: JSON = attrs.Factory(dict)  # kind -> {path, sha256, seq}
    last_check: JSON | None = None  # ChecksRecorded payload + seq
    last_recovery: JSON | None = None  # RecoveryPlanned payload + seq
    last_handoff: JSON | None = None  # HandoffDecided payload + seq
    reason_codes: tuple[str, ...] = ()  # why the candidate is where it is (reject / recovering)
    decisive_seq: int | None = None  # the event that moved it into its current state
    decisive_type: str | None = None

    def to_dict(self) -> JSON:
        return attrs.asdict(self, recurse=False) | {"reason_codes": list(self.reason_codes)}


def candidate_from_dict(data: Mapping[str, Any]) -> CandidateState:
    """Rebuild a candidate from `to_dict` output (a checkpoint); strict about fields."""
    fields = dict(data)
    fields["reason_codes"] = tuple(fields["reason_codes"])
    return CandidateState(**fields)


def settings_from_dict(data: Mapping[str, Any]) -> LedgerSettings:
    """Rebuild settings from `attrs.asdict` output (a checkpoint)."""
    return LedgerSettings(**data)


def apply_settings(settings: LedgerSettings, type_name: str, payload: Mapping[str, Any], seq: int) -> LedgerSettings:
    """Fold one event of the ledger's own stream."""
    version = settings.version + 1
    if type_name == "LedgerInitialized":
        return attrs.evolve(
            settings,
            initialized=True,
            max_window_age=payload["max_window_age"],
            active_window=payload["active_window"],
            version=version,
            last_seq=seq,
        )
    if type_name == "BaselineActivated":
        return attrs.evolve(settings, baseline=dict(payload), version=version, last_seq=seq)
    if type_name == "WindowAdvanced":
        return attrs.evolve(settings, active_window=payload["active_window"], version=version, last_seq=seq)
    if type_name == "EvaluationActivated":
        return attrs.evolve(settings, evaluation_version=payload["evaluation_version"], version=version, last_seq=seq)
    raise CorruptionError(f"seq {seq}: {type_name} does not belong on the ledger stream", seq=seq, found=type_name)


def _reasons(type_name: str, payload: Mapping[str, Any], dest: str, previous: tuple[str, ...]) -> tuple[str, ...]:
    if type_name in ("ChecksRecorded", "HandoffDecided"):
        return tuple(payload["reason_codes"])
    if type_name == "RecoveryPlanned":
        return (payload["action"],) if payload["blocking"] else ()
    if type_name == "EvidenceInvalidated":
        return (f"{payload['cause']}_changed",)
    if type_name == "CandidateReceived":
        return ()
    return previous


def apply_candidate(
    current: CandidateState | None,
    type_name: str,
    payload: Mapping[str, Any],
    *,
    seq: int,
    stream_id: str,
    version: int | None = None,
) -> CandidateState:
    """Fold one event of a candidate's stream, validating the move against the table."""
    cls = EVENT_TYPES.get(type_name)
    try:
        trigger = cls.trigger_for(payload) if cls is not None else None
    except (KeyError, ValueError) as e:
        raise CorruptionError(f"seq {seq}: {type_name} payload is unreadable ({e})", seq=seq) from e
    if trigger is None:
        raise CorruptionError(f"seq {seq}: {type_name} does not belong on a candidate stream", seq=seq, found=type_name)
    state = None if current is None else current.state
    dest = next_state(state, trigger)
    if dest is None:
        raise IllegalTransition(seq=seq, stream_id=stream_id, state=state, trigger=trigger, type_name=type_name)
    expected_version = 1 if current is None else current.version + 1
    if version is not None and version != expected_version:
        raise CorruptionError(
            f"seq {seq}: stream {stream_id} jumps to version {version}, expected {expected_version}", seq=seq
        )
    if type_name == "CandidateReceived":
        expected_revision = 0 if current is None else current.revision + 1
        if payload["revision"] != expected_revision or stream_id != stream_of(payload["candidate_id"]):
            raise CorruptionError(
                f"seq {seq}: CandidateReceived for {payload['candidate_id']!r} revision {payload['revision']} "
                f"does not follow on stream {stream_id} (expected revision {expected_revision})",
                seq=seq,
            )
        candidate = payload["candidate"]
        return CandidateState(
            candidate_id=payload["candidate_id"],
            state=dest,
            version=expected_version,
            last_seq=seq,
            kind=candidate.get("candidate_kind"),
            candidate=dict(candidate),
            manifest_path=payload["manifest_path"],
            revision=payload["revision"],
            trusted_states={} if current is None else current.trusted_states,
            decisive_seq=seq,
            decisive_type=type_name,
        )
    assert current is not None  # the table only allows `receive` from no state
    changes: JSON = {"state": dest, "version": expected_version, "last_seq": seq}
    if dest != state:
        changes["decisive_seq"] = seq
        changes["decisive_type"] = type_name
        changes["reason_codes"] = _reasons(type_name, payload, dest, current.reason_codes)
    if type_name == "ChecksRecorded":
        changes["last_check"] = {**payload, "seq": seq}
        if dest == state:  # a passing re-check keeps the state; its evidence is still news
            changes["reason_codes"] = tuple(payload["reason_codes"])
    elif type_name == "HandoffDecided":
        changes["last_handoff"] = {**payload, "seq": seq}
    elif type_name == "RecoveryPlanned":
        changes["last_recovery"] = {**payload, "seq": seq}
    elif type_name == "TrustedStateRecorded":
        trusted = dict(current.trusted_states)
        trusted[payload["kind"]] = {"path": payload["path"], "sha256": payload["sha256"], "seq": seq}
        changes["trusted_states"] = trusted
    elif type_name == "TrustedStateInvalidated":
        trusted = dict(current.trusted_states)
        trusted.pop(payload["kind"], None)
        changes["trusted_states"] = trusted
    return attrs.evolve(current, **changes)


def apply(
    state: CandidateState | LedgerSettings | None, event: Event, *, seq: int, stream_id: str
) -> CandidateState | LedgerSettings:
    """The typed fold: the state of `stream_id` after `event` recorded at `seq`."""
    payload = event.to_payload()
    if stream_id == LEDGER_STREAM:
        settings = state if isinstance(state, LedgerSettings) else LedgerSettings()
        return apply_settings(settings, event.TYPE, payload, seq)
    if candidate_id_of(stream_id) is None:
        raise CorruptionError(f"seq {seq}: unknown stream {stream_id!r}", seq=seq)
    current = state if isinstance(state, CandidateState) else None
    return apply_candidate(current, event.TYPE, payload, seq=seq, stream_id=stream_id)
