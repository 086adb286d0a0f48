"""State as a fold of events: `apply(state, event) -> state`, pure and total.

No callbacks, no I/O, no clock: the same events give the same state on any machine.
Every candidate event is checked against the machine's `TABLE`; an illegal move is
an `IllegalTransition` naming the seq, what the table allows there, and what was
found. The fold works on payload dicts (replay never builds event objects) and the
typed `apply` is a thin wrapper over the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import EVENT_TYPES, LEDGER_STREAM, Event, candidate_id_of, stream_of
from lifecycle_fsm.machine import TABLE_BY_STATE, allowed_triggers

__all__ = [
    "CandidateState",
    "IllegalTransition",
    "LedgerSettings",
    "apply",
    "apply_candidate",
    "apply_settings",
    "candidate_from_dict",
    "settings_from_dict",
    "step_candidate",
    "step_candidate_at",
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
    manifest_sha256: str | None = None  # the received manifest file's bytes

    def to_dict(self) -> JSON:
        """JSON-ready fields (what checkpoints store)."""
        return self.to_work() | {"reason_codes": list(self.reason_codes)}

    def to_work(self) -> JSON:
        """The fields as a working dict for `step_candidate` (shallow: nested values shared)."""
        return {name: getattr(self, name) for name in _CANDIDATE_FIELDS}

    @classmethod
    def from_work(cls, work: Mapping[str, Any]) -> CandidateState:
        return cls(**work)


_CANDIDATE_FIELDS = tuple(a.name for a in attrs.fields(CandidateState))


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
    work = None if current is None else current.to_work()
    owned = dict(payload)  # step_candidate keeps the payload; the caller keeps theirs
    return CandidateState.from_work(
        step_candidate(work, type_name, owned, seq=seq, stream_id=stream_id, version=version)
    )


def _trigger_tables() -> tuple[dict[str, str], dict[str, Callable[[Mapping[str, Any]], str]]]:
    """Candidate event types whose trigger is fixed, and those that read it from the payload."""
    fixed: dict[str, str] = {}
    by_payload: dict[str, Callable[[Mapping[str, Any]], str]] = {}
    for name, cls in EVENT_TYPES.items():
        if cls.FIXED_TRIGGER is not None:
            fixed[name] = cls.FIXED_TRIGGER
        elif cls.trigger_for.__func__ is not Event.trigger_for.__func__:  # type: ignore[attr-defined]
            by_payload[name] = cast("Callable[[Mapping[str, Any]], str]", cls.trigger_for)
        # else: a ledger-setting event, which has no trigger and no place on a candidate stream
    return fixed, by_payload


_FIXED_TRIGGERS, _PAYLOAD_TRIGGERS = _trigger_tables()


def step_candidate(
    work: JSON | None,
    type_name: str,
    payload: JSON,
    *,
    seq: int,
    stream_id: str,
    version: int | None = None,
) -> JSON:
    """`step_candidate_at` with keyword arguments."""
    return step_candidate_at(work, type_name, payload, seq, stream_id, version)


def step_candidate_at(
    work: JSON | None, type_name: str, payload: JSON, seq: int, stream_id: str, version: int | None
) -> JSON:
    """The fold's one rule, on a working dict (`CandidateState.to_work`), updated in place.

    Replay keeps one working dict per candidate and freezes them at the end, so a
    million events cost a million dict updates, not a million frozen copies (and it
    is called positionally: keyword calls cost measurably on that path). Nested
    values are replaced, never mutated, so a frozen state a dict came from is safe.
    `payload` must be the caller's own fresh dict: the fold keeps it (with its `seq`
    added) as the candidate's last check, recovery or hand-off rather than copy it.
    """
    trigger = _FIXED_TRIGGERS.get(type_name)
    if trigger is None:
        trigger_for = _PAYLOAD_TRIGGERS.get(type_name)
        if trigger_for is None:
            raise CorruptionError(
                f"seq {seq}: {type_name} does not belong on a candidate stream", seq=seq, found=type_name
            )
        try:
            trigger = trigger_for(payload)
        except (KeyError, ValueError) as e:
            raise CorruptionError(f"seq {seq}: {type_name} payload is unreadable ({e})", seq=seq) from e
    if work is None:
        state = None
        expected_version = 1
    else:
        state = work["state"]
        expected_version = work["version"] + 1
    dest = TABLE_BY_STATE[state].get(trigger)
    if dest is None:
        raise IllegalTransition(seq=seq, stream_id=stream_id, state=state, trigger=trigger, type_name=type_name)
    if version is not None and version != expected_version:
        raise CorruptionError(
            f"seq {seq}: stream {stream_id} jumps to version {version}, expected {expected_version}", seq=seq
        )
    if type_name == "CandidateReceived":
        return _received(work, payload, seq=seq, stream_id=stream_id, dest=dest, version=expected_version)
    assert work is not None  # the table only allows `receive` from no state
    work["state"] = dest
    work["version"] = expected_version
    work["last_seq"] = seq
    if dest != state or type_name == "RecoveryPlanned":  # a re-plan is the new reason it is recovering
        work["decisive_seq"] = seq
        work["decisive_type"] = type_name
        work["reason_codes"] = _reasons(type_name, payload, dest, work["reason_codes"])
    if type_name == "ChecksRecorded":
        payload["seq"] = seq
        work["last_check"] = payload
        if dest == state:  # a passing re-check keeps the state; its evidence is still news
            work["reason_codes"] = tuple(payload["reason_codes"])
    elif type_name == "HandoffDecided":
        payload["seq"] = seq
        work["last_handoff"] = payload
    elif type_name == "RecoveryPlanned":
        payload["seq"] = seq
        work["last_recovery"] = payload
    elif type_name == "TrustedStateRecorded":
        trusted = dict(work["trusted_states"])
        trusted[payload["kind"]] = {"path": payload["path"], "sha256": payload["sha256"], "seq": seq}
        work["trusted_states"] = trusted
    elif type_name == "TrustedStateInvalidated":
        trusted = dict(work["trusted_states"])
        trusted.pop(payload["kind"], None)
        work["trusted_states"] = trusted
    return work


def _received(
    work: JSON | None, payload: Mapping[str, Any], *, seq: int, stream_id: str, dest: str, version: int
) -> JSON:
    expected_revision = 0 if work is None else work["revision"] + 1
    if payload["revision"] != expected_revision or stream_id != stream_of(payload["candidate_id"]):
        raise CorruptionError(
            f"seq {seq}: CandidateReceived for {payload['candidate_id']!r} revision {payload['revision']} "
            f"does not follow on stream {stream_id} (expected revision {expected_revision})",
            seq=seq,
        )
    candidate = payload["candidate"]
    return {
        "candidate_id": payload["candidate_id"],
        "state": dest,
        "version": version,
        "last_seq": seq,
        "kind": candidate.get("candidate_kind"),
        "candidate": dict(candidate),
        "manifest_path": payload["manifest_path"],
        "revision": payload["revision"],
        "trusted_states": {} if work is None else work["trusted_states"],
        "last_check": None,
        "last_recovery": None,
        "last_handoff": None,
        "reason_codes": (),
        "decisive_seq": seq,
        "decisive_type": "CandidateReceived",
        "manifest_sha256": payload["manifest_sha256"],
    }


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
