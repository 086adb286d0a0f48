"""State as a fold of events: `apply(state, event) -> state`, pure and total.

No callbacks, no I/O, no clock: the same events give the same state on any machine.
Every candidate event is checked against the machine's table; an illegal move is an
`IllegalTransition` naming the seq, what the table allows there, and what was found.
What an event does to state is said by its class (`events.py`); this module builds one
step per candidate event type from its class and the table (`_candidate_step`) and
dispatches on the type. The fold works on payload dicts (replay never builds event
objects) and the typed `apply` is a thin wrapper over the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson

from lifecycle_fsm.deferred import Factory, field_names, frozen, waits_for_attrs
from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import CANDIDATE_EVENTS, LEDGER_EVENTS, LEDGER_STREAM, CandidateEvent, Event, candidate_id_of
from lifecycle_fsm.machine import TABLE_BY_STATE, State, allowed_triggers

__all__ = [
    "CANDIDATE_STEPS",
    "KEPT_FIELDS",
    "REPLAY_STEPS",
    "CandidateState",
    "IllegalTransition",
    "LedgerSettings",
    "apply",
    "apply_candidate",
    "apply_settings",
    "as_state",
    "candidate_from_dict",
    "kept_payload",
    "not_a_candidate_event",
    "reading_stored",
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


@frozen
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

    def summary(self) -> JSON:
        """What a check is judged against (recorded in check evidence, printed by the CLI)."""
        return {
            "active_policy_version": self.active_policy_version,
            "active_window": self.active_window,
            "max_window_age": self.max_window_age,
            "evaluation_version": self.evaluation_version,
        }


# Each state's name (an exact `str` key: a look-up by a plain string takes dict's fast path) -> its member.
_STATE_OF: dict[str, State] = {s.value: s for s in State}


def as_state(value: str) -> State:
    """The `State` member `value` names (a member is itself); ValueError for anything else."""
    member = _STATE_OF.get(value) if isinstance(value, str) else None
    if member is None:
        raise ValueError(f"{value!r} is not a candidate state (expected one of {', '.join(_STATE_OF)})")
    return member


@frozen
class CandidateState:
    """One candidate as the log says it is now; `state` is always a `State` member.

    The fold keeps the machine table's plain strings in its working dicts (the cheapest
    per-event look-ups: issue #13) and a state becomes the enum member once, when a
    `CandidateState` is made (`__attrs_post_init__`): every one a caller can see, whether
    folded, restored from a checkpoint's JSON or built by hand.
    """

    candidate_id: str
    state: State
    version: int
    last_seq: int
    kind: str | None
    candidate: JSON  # parsed manifest fields (CandidateReceived.candidate)
    manifest_path: str | None  # None while a registered candidate waits for its adapter
    revision: int = 0
    trusted_states: JSON = Factory(dict)  # kind -> {path, sha256, seq}
    last_check: JSON | None = None  # ChecksRecorded payload + seq
    last_recovery: JSON | None = None  # RecoveryPlanned payload + seq
    last_handoff: JSON | None = None  # HandoffDecided payload + seq
    reason_codes: tuple[str, ...] = ()  # why the candidate is where it is (reject / recovering)
    decisive_seq: int | None = None  # the event that moved it into its current state
    decisive_type: str | None = None
    manifest_sha256: str | None = None  # the received manifest file's bytes
    pending: bool = False  # registered, its adapter not received yet: cannot be checked or handed off
    provenance: JSON | None = None  # what produced it (CandidateRegistered), None when never registered

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "state", as_state(self.state))  # frozen: attrs' own way of setting a field

    def to_dict(self) -> JSON:
        """JSON-ready fields (what checkpoints store; a `State` serialises as its value)."""
        return self.to_work() | {"reason_codes": list(self.reason_codes)}

    def to_work(self) -> JSON:
        """The fields as a working dict for `step_candidate` (shallow: nested values shared)."""
        return {name: getattr(self, name) for name in _CANDIDATE_FIELDS}

    @classmethod
    def from_work(cls, work: Mapping[str, Any]) -> CandidateState:
        """Freeze the fold's working dict. One with exactly the fields and a known state
        (every fold's) fills the instance's `__dict__` directly: a third of attrs' `__init__`
        with its per-field frozen `setattr` and `__attrs_post_init__` (issue #13: once per
        command and per read). Anything else goes through `__init__` and its checks."""
        state = _STATE_OF.get(work.get("state"))  # type: ignore[arg-type]
        if state is None or work.keys() != _FIELD_SET or cls is not CandidateState or waits_for_attrs(cls):
            return cls(**work)
        made = object.__new__(cls)
        fields = made.__dict__
        fields.update(work)
        fields["state"] = state
        return made


_CANDIDATE_FIELDS = field_names(CandidateState)
_FIELD_SET = frozenset(_CANDIDATE_FIELDS)


def candidate_from_dict(data: Mapping[str, Any]) -> CandidateState:
    """Rebuild a candidate from `to_dict` output (a checkpoint); strict about fields."""
    fields = dict(data)
    fields["reason_codes"] = tuple(fields["reason_codes"])
    return CandidateState(**fields)


def settings_from_dict(data: Mapping[str, Any]) -> LedgerSettings:
    """Rebuild settings from `attrs.asdict` output (a checkpoint)."""
    return LedgerSettings(**data)


def _fields(cls: type[Event]) -> frozenset[str]:
    return frozenset(field_names(cls))


def _stored_keys(fields: frozenset[str]) -> tuple[str, ...]:
    """A payload's keys in the order the store writes them (sorted), as the parser's own strings.

    `orjson` hands out one cached string object per short key, so a parsed payload's keys
    compared with these are identity hits, not character compares: the fast check of
    `_candidate_step`, for the payloads every append writes (canonical JSON: sorted keys).
    """
    keys: tuple[str, ...] = tuple(orjson.loads(orjson.dumps(dict.fromkeys(sorted(fields), 0))))
    return keys


_LEDGER_FIELDS = {name: _fields(cls) for name, cls in LEDGER_EVENTS.items()}


def _wrong_fields(seq: int, type_name: str, payload: Mapping[str, Any], fields: frozenset[str]) -> CorruptionError:
    missing, extra = sorted(fields - payload.keys()), sorted(payload.keys() - fields)
    return CorruptionError(
        f"seq {seq}: {type_name} payload does not match its schema (missing {missing}, unexpected {extra})", seq=seq
    )


def _unreadable(seq: int, type_name: str, error: Exception) -> CorruptionError:
    """A stored payload the fold cannot read: corruption at that seq, never a crash."""
    return CorruptionError(f"seq {seq}: {type_name} payload is unreadable ({error!r})", seq=seq)


@contextmanager
def reading_stored(seq: int, type_name: str) -> Iterator[None]:
    """Interpret a stored payload beside the fold (explain, history, log, the decision pool): a field
    missing or of the wrong type is corruption at that seq (exit 6), as it is in the fold, never a crash.

    The row's own hash holds (every read checks it), so only someone who re-hashed it wrote it.
    """
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise _unreadable(seq, type_name, e) from e


def apply_settings(settings: LedgerSettings, type_name: str, payload: Mapping[str, Any], seq: int) -> LedgerSettings:
    """Fold one event of the ledger's own stream (the event class says what it sets)."""
    cls = LEDGER_EVENTS.get(type_name)
    if cls is None:
        raise CorruptionError(f"seq {seq}: {type_name} does not belong on the ledger stream", seq=seq, found=type_name)
    if payload.keys() != _LEDGER_FIELDS[type_name]:
        raise _wrong_fields(seq, type_name, payload, _LEDGER_FIELDS[type_name])
    try:
        changes = cls.settle(payload)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _unreadable(seq, type_name, e) from e
    import attrs  # imported already: `settings` is an instance

    return attrs.evolve(settings, **changes, version=settings.version + 1, last_seq=seq)


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
    owned = dict(payload)  # the fold keeps the payload it is given; the caller keeps theirs
    return CandidateState.from_work(step_candidate_at(work, type_name, owned, seq, stream_id, version))


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

    Dispatches to the type's step in `CANDIDATE_STEPS` (replay calls those directly) and
    keeps the payload in the type's `KEPT_AS` field. `version` None: the stream's next.
    `payload` must be the caller's own fresh dict: handlers may keep it.
    """
    entry = REPLAY_STEPS.get(type_name)
    if entry is None:
        raise not_a_candidate_event(seq, type_name)
    step, kept_as = entry
    if version is None:
        version = 1 if work is None else work["version"] + 1
    work = step(work, payload, seq, stream_id, version)
    if kept_as is not None:
        work[kept_as] = kept_payload(payload, seq)
    return work


def not_a_candidate_event(seq: int, type_name: str) -> CorruptionError:
    return CorruptionError(f"seq {seq}: {type_name} does not belong on a candidate stream", seq=seq, found=type_name)


def kept_payload(payload: JSON, seq: int) -> JSON:
    """What an event's `KEPT_AS` field holds: its payload and the seq it was recorded at."""
    payload["seq"] = seq
    return payload


CandidateStep = Callable[[JSON | None, JSON, int, str, int], JSON]


def _candidate_step(cls: type[CandidateEvent]) -> CandidateStep:
    """One event type's fold step: the machine's table decides the move, the class its effect.

    Everything the type fixes is looked up once here, not per event: its fields, the
    table row of a fixed trigger, and whether it overrides `evolve` / `reasons` at all.
    Replay keeps one working dict per candidate and freezes them at the end, so a
    million events cost a million dict updates, not a million frozen copies; it calls
    the step positionally (keyword calls cost measurably on that path) and keeps
    `KEPT_AS` itself (the stored row, parsed once at the end: `replay/fold.py`), so the
    step leaves that field to its caller. A step writes only what the event changes:
    `version` and `last_seq` always, the state and its reason only on a decisive event
    (issue #13: every dict write is on the replay bill).
    """
    type_name = cls.TYPE
    fields = _fields(cls)
    stored_keys = _stored_keys(fields)
    fixed = cls.FIXED_TRIGGER
    trigger_for = cls.trigger_for
    # A fixed trigger's move from each state, straight from the table (None: not allowed).
    fixed_dest = {state: row.get(fixed) for state, row in TABLE_BY_STATE.items()} if fixed else {}
    table = TABLE_BY_STATE
    evolve = None if cls.evolve is CandidateEvent.evolve else cls.evolve
    reasons = None if cls.reasons is CandidateEvent.reasons else cls.reasons
    decisive_when_kept = cls.DECISIVE_WHEN_KEPT

    def step(work: JSON | None, payload: JSON, seq: int, stream_id: str, version: int) -> JSON:
        # Every field, nothing else: a stored payload is never guessed at (the key tuple first:
        # cheaper, and what a canonical payload holds; any other order is compared as a set).
        if tuple(payload) != stored_keys and payload.keys() != fields:
            raise _wrong_fields(seq, type_name, payload, fields)
        if work is None:
            state = None
            expected_version = 1
        else:
            state = work["state"]
            expected_version = work["version"] + 1
        if fixed is None:
            try:
                trigger = trigger_for(payload)
            except (KeyError, TypeError, ValueError) as e:
                raise _unreadable(seq, type_name, e) from e
            dest = table[state].get(trigger)
        else:
            trigger = fixed
            dest = fixed_dest[state]
        if dest is None:
            raise IllegalTransition(seq=seq, stream_id=stream_id, state=state, trigger=trigger, type_name=type_name)
        if version != expected_version:
            raise CorruptionError(
                f"seq {seq}: stream {stream_id} jumps to version {version}, expected {expected_version}", seq=seq
            )
        try:
            if evolve is not None:
                work = evolve(work, payload, seq, stream_id)
            assert work is not None
            if dest != state or decisive_when_kept:  # else the state, its reasons and decisive event stay
                work["state"] = dest
                work["decisive_seq"] = seq
                work["decisive_type"] = type_name
                if reasons is not None:
                    work["reason_codes"] = reasons(payload, work["reason_codes"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise _unreadable(seq, type_name, e) from e
        work["version"] = version
        work["last_seq"] = seq
        return work

    return step


# type -> (its fold step, the field that keeps its payload): what replay looks up once per
# candidate event, and `step_candidate_at` too.
REPLAY_STEPS: dict[str, tuple[CandidateStep, str | None]] = {
    name: (_candidate_step(cls), cls.KEPT_AS) for name, cls in CANDIDATE_EVENTS.items()
}
# type -> its fold step alone.
CANDIDATE_STEPS: dict[str, CandidateStep] = {name: step for name, (step, _) in REPLAY_STEPS.items()}
KEPT_FIELDS = tuple(sorted({cls.KEPT_AS for cls in CANDIDATE_EVENTS.values() if cls.KEPT_AS}))


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
