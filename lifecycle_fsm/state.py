"""State as a fold of stored events: pure, no I/O, no clock, the same result on any machine.

`Fold` is the one place state changes: commands, reads, replay and explain all feed it stored rows. Each
candidate event's move is checked against the machine's table, its payload against its class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs

from lifecycle_fsm.candidate_events import CANDIDATE_EVENTS, EVENT_TYPES, CandidateEvent
from lifecycle_fsm.errors import CorruptionError, InputError
from lifecycle_fsm.events import CANDIDATE_PREFIX, LEDGER_EVENTS, LEDGER_STREAM, SEALS_STREAM, Event, candidate_id_of
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.machine import TABLE, State, allowed_triggers
from lifecycle_fsm.rules import RULES
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import StoredEvent
from lifecycle_fsm.upcasting import check_row, parsed_payload

# A stored event as the fold reads it: seq, stream_id, version, type, schema_version, payload text.
Row = tuple[int, str, int, str, int, str]


@attrs.frozen
class LedgerSettings:
    """What every check reads: the active baseline, window and evaluation version."""

    initialized: bool = False
    max_window_age: int | None = None
    active_window: int | None = None
    baseline: JSON | None = None  # the active BaselineActivated payload
    baselines: dict[str, JSON] = attrs.Factory(dict)  # every baseline activated, by policy version
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


@attrs.frozen
class CandidateState:
    """One candidate as the log says it is now."""

    candidate_id: str
    state: State = attrs.field(converter=State)
    version: int
    last_seq: int
    kind: str | None
    candidate: JSON  # parsed manifest fields (CandidateReceived.candidate)
    manifest_path: str | None  # None while a registered candidate waits for its adapter
    revision: int = 0
    trusted_states: JSON = attrs.Factory(dict)  # kind -> {path, sha256, seq}
    last_check: JSON | None = None  # ChecksRecorded payload + seq
    last_recovery: JSON | None = None  # RecoveryPlanned payload + seq
    last_handoff: JSON | None = None  # HandoffDecided payload + seq
    reason_codes: tuple[str, ...] = ()  # why the candidate is where it is (reject / recovering)
    decisive_seq: int | None = None  # the event that moved it into its current state
    decisive_type: str | None = None
    manifest_sha256: str | None = None  # the received manifest file's bytes
    pending: bool = False  # registered, its adapter not received yet: cannot be checked or handed off
    provenance: JSON | None = None  # what produced it (CandidateRegistered), None when never registered

    def to_dict(self) -> JSON:
        """JSON-ready fields (what checkpoints store)."""
        return attrs.asdict(self, recurse=False) | {"state": self.state.value, "reason_codes": list(self.reason_codes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CandidateState:
        """Rebuild a candidate from `to_dict` output; every field, nothing else."""
        fields = dict(data)  # a ValueError or TypeError for what is no object
        if fields.keys() != _CANDIDATE_FIELDS:
            raise KeyError(f"fields {sorted(fields.keys() ^ _CANDIDATE_FIELDS)} differ from CandidateState's")
        return cls(**{**fields, "reason_codes": tuple(fields["reason_codes"])})


_CANDIDATE_FIELDS = frozenset(a.name for a in attrs.fields(CandidateState))


@attrs.frozen
class LedgerState:
    """Every candidate and the ledger settings as of `position`."""

    settings: LedgerSettings
    candidates: dict[str, CandidateState]
    position: int
    streams: dict[str, int] = attrs.Factory(dict)  # versions of streams that change no state (`seals`)

    def to_json(self) -> JSON:
        return {
            "position": self.position,
            "settings": attrs.asdict(self.settings, recurse=False),
            "candidates": {cid: c.to_dict() for cid, c in sorted(self.candidates.items())},
            "streams": dict(sorted(self.streams.items())),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerState:
        return cls(
            settings=LedgerSettings(**data["settings"]),
            candidates={cid: CandidateState.from_dict(c) for cid, c in data["candidates"].items()},
            position=data["position"],
            streams=dict(data["streams"]),
        )

    def snapshot(self) -> str:
        """The canonical text of this state: what checkpoints store and replays are compared by."""
        return canonical_json(self.to_json())


EMPTY = LedgerState(LedgerSettings(), {}, 0)


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


_FIELDS = {name: frozenset(a.name for a in attrs.fields(cls)) for name, cls in EVENT_TYPES.items()}
# What reading a stored payload of the wrong shape raises: corruption at that seq, never a crash.
_UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, IndexError)


@contextmanager
def reading_stored(seq: int, type_name: str) -> Iterator[None]:
    """Interpret a stored payload: a field missing or of the wrong type is corruption at that seq, never a crash."""
    try:
        yield
    except _UNREADABLE as e:
        raise _unreadable(seq, type_name, e) from e


def _unreadable(seq: int, type_name: str, error: Exception) -> CorruptionError:
    return CorruptionError(f"seq {seq}: {type_name} payload is unreadable ({error!r})", seq=seq)


def check_fields(seq: int, type_name: str, payload: Mapping[str, Any]) -> None:
    """Every field of the event's class, nothing else: a stored payload is never guessed at."""
    fields = _FIELDS[type_name]
    if payload.keys() != fields:
        missing, extra = sorted(fields - payload.keys()), sorted(payload.keys() - fields)
        raise CorruptionError(
            f"seq {seq}: {type_name} payload does not match its schema (missing {missing}, unexpected {extra})",
            seq=seq,
        )


@attrs.frozen
class CandidateStep:
    """A candidate event's class read off once for the fold, which runs per event (inherited no-ops: None)."""

    type_name: str
    fields: frozenset[str]
    fixed_trigger: str | None
    trigger_for: Callable[[Mapping[str, Any]], str]
    evolve: Callable[[JSON | None, JSON, int, str], JSON] | None
    reasons: Callable[[Mapping[str, Any], tuple[str, ...]], tuple[str, ...]] | None
    decisive_when_kept: bool
    kept_as: str | None

    @classmethod
    def of(cls, event: type[CandidateEvent]) -> CandidateStep:
        return cls(
            type_name=event.TYPE,
            fields=_FIELDS[event.TYPE],
            fixed_trigger=event.FIXED_TRIGGER,
            trigger_for=event.trigger_for,
            evolve=None if event.evolve is CandidateEvent.evolve else event.evolve,
            reasons=None if event.reasons is CandidateEvent.reasons else event.reasons,
            decisive_when_kept=event.DECISIVE_WHEN_KEPT,
            kept_as=event.KEPT_AS,
        )

    def step(self, work: JSON | None, payload: JSON, seq: int, stream_id: str, version: int) -> JSON:
        """One candidate event: the table decides the move, the event's class its effect."""
        if payload.keys() != self.fields:
            check_fields(seq, self.type_name, payload)
        state = None if work is None else work["state"]
        try:  # not `reading_stored`: this runs per event
            trigger = self.fixed_trigger or self.trigger_for(payload)
            dest = TABLE.get((state, trigger))
            if dest is None:
                raise IllegalTransition(
                    seq=seq, stream_id=stream_id, state=state, trigger=trigger, type_name=self.type_name
                )
            expected = 1 if work is None else work["version"] + 1
            if version != expected:
                message = f"seq {seq}: stream {stream_id} jumps to version {version}, expected {expected}"
                raise CorruptionError(message, seq=seq)
            if self.evolve is not None:
                work = self.evolve(work, payload, seq, stream_id)
            assert work is not None, "the table starts a stream only with an event that evolves one"
            if dest != state or self.decisive_when_kept:  # else the state, its reasons and decisive event stay
                work["state"] = dest
                work["decisive_seq"] = seq
                work["decisive_type"] = self.type_name
                if self.reasons is not None:
                    work["reason_codes"] = self.reasons(payload, work["reason_codes"])
        except _UNREADABLE as e:
            raise _unreadable(seq, self.type_name, e) from e
        if self.kept_as is not None:
            payload["seq"] = seq  # the fold's own parsed payload: kept as it is
            work[self.kept_as] = payload
        work["version"] = version
        work["last_seq"] = seq
        return work


_STEPS = {name: CandidateStep.of(cls) for name, cls in CANDIDATE_EVENTS.items()}


def rows_of(events: Iterable[StoredEvent]) -> Iterator[Row]:
    """Stored events as the rows a `Fold` reads, each row's own hash checked first (fail closed)."""
    for e in events:
        check_row(e)
        yield (e.seq, e.stream_id, e.version, e.type, e.schema_version, e.payload)


class Fold:
    """Folds stored rows, in seq order, onto a starting state (`whole_log`: every row after its position, so
    a gap is corruption). A candidate is a working dict while the fold runs, a `CandidateState` at the end."""

    def __init__(self, start: LedgerState = EMPTY, *, whole_log: bool = False) -> None:
        self._start = start
        self._works: dict[str, JSON] = {}
        self.settings = start.settings
        self.position = start.position
        self._streams = dict(start.streams)
        self._whole_log = whole_log

    def add(self, row: Row) -> None:
        """Fold one stored event; CorruptionError names its seq when the log is not what it must be."""
        self.extend((row,))

    def extend(self, rows: Iterable[Row]) -> None:
        """Fold stored events in seq order, as `add` does each (the loop kept here: it runs per event)."""
        works, whole_log, position = self._works, self._whole_log, self.position
        try:
            for seq, stream_id, version, type_name, schema_version, text in rows:
                if seq != position + 1 and (whole_log or seq <= position):
                    raise _misplaced(seq, position, gap=whole_log)
                position = seq
                step = _STEPS.get(type_name)
                if step is not None and stream_id.startswith(CANDIDATE_PREFIX):
                    payload = parsed_payload(seq, type_name, schema_version, text)
                    work = works.get(stream_id) or self.work(stream_id)
                    works[stream_id] = step.step(work, payload, seq, stream_id, version)
                else:
                    self._other(seq, stream_id, version, type_name, schema_version, text)
        finally:
            self.position = position  # up to the row folded, or the one that failed

    def _other(self, seq: int, stream_id: str, version: int, type_name: str, schema_version: int, text: str) -> None:
        """An event that is not a candidate event on a candidate stream: the ledger's, a seal, or corruption."""
        if stream_id.startswith(CANDIDATE_PREFIX):
            if type_name not in EVENT_TYPES:
                raise CorruptionError(f"unknown event type {type_name!r}", seq=seq, found=type_name)
            raise CorruptionError(f"seq {seq}: {type_name} does not belong on a candidate stream", seq=seq)
        if stream_id == LEDGER_STREAM:
            if type_name not in LEDGER_EVENTS:
                message = f"seq {seq}: {type_name} does not belong on the ledger stream"
                raise CorruptionError(message, seq=seq, found=type_name)
            self.settings = _settle(self.settings, type_name, parsed_payload(seq, type_name, schema_version, text), seq)
        elif stream_id == SEALS_STREAM:
            parsed_payload(seq, type_name, schema_version, text)
            self._streams[stream_id] = version  # a seal decides nothing: only its stream's version is kept
        else:
            raise CorruptionError(f"seq {seq}: unknown stream {stream_id!r}", seq=seq)

    def work(self, stream_id: str) -> JSON | None:
        """A candidate's working dict as folded so far (None before its first event)."""
        work = self._works.get(stream_id)
        if work is None:
            held = self._start.candidates.get(candidate_id_of(stream_id) or "")
            if held is not None:
                work = self._works[stream_id] = attrs.asdict(held, recurse=False)
        return work

    def result(self) -> LedgerState:
        candidates = self._start.candidates | {w["candidate_id"]: CandidateState(**w) for w in self._works.values()}
        return LedgerState(self.settings, candidates, self.position, dict(self._streams))  # the fold goes on


def fold(rows: Iterable[Row], start: LedgerState = EMPTY, *, whole_log: bool = False) -> LedgerState:
    """`start` with `rows` folded on: the fold every command, read, replay and checkpoint uses."""
    folding = Fold(start, whole_log=whole_log)
    folding.extend(rows)
    return folding.result()


def apply(
    state: CandidateState | LedgerSettings | None, event: Event, *, seq: int | None = None, stream_id: str | None = None
) -> CandidateState | LedgerSettings:
    """The typed fold of one event: the state of `stream_id` (by default the ledger's, the state's candidate
    or the one the event names) after `event` recorded at `seq` (by default the next)."""
    if stream_id is None:
        named = state.candidate_id if isinstance(state, CandidateState) else getattr(event, "candidate_id", None)
        stream_id = LEDGER_STREAM if event.TYPE in LEDGER_EVENTS else CANDIDATE_PREFIX + str(named)
        if named is None and event.TYPE not in LEDGER_EVENTS:
            raise InputError(f"{event.TYPE} names no candidate: give apply() its stream_id")
    if isinstance(state, CandidateState if stream_id == LEDGER_STREAM else LedgerSettings):
        raise InputError(f"{event.TYPE} on stream {stream_id!r} does not fold onto a {type(state).__name__}")
    if seq is None:
        seq = 1 if state is None else state.last_seq + 1
    version = 1 if state is None else state.version + 1
    row: Row = (seq, stream_id, version, event.TYPE, event.SCHEMA_VERSION, canonical_json(event.to_payload()))
    if stream_id == LEDGER_STREAM:
        settings = state if isinstance(state, LedgerSettings) else LedgerSettings()
        return fold([row], LedgerState(settings, {}, settings.last_seq)).settings
    cid = candidate_id_of(stream_id)
    if cid is None:
        raise CorruptionError(f"seq {seq}: unknown stream {stream_id!r}", seq=seq)
    return fold([row], stream_start(state if isinstance(state, CandidateState) else None)).candidates[cid]


def _settle(settings: LedgerSettings, type_name: str, payload: JSON, seq: int) -> LedgerSettings:
    """Fold one event of the ledger's own stream (the event class says what it sets)."""
    check_fields(seq, type_name, payload)
    with reading_stored(seq, type_name):
        changes = LEDGER_EVENTS[type_name].settle(settings, payload)
    return attrs.evolve(settings, **changes, version=settings.version + 1, last_seq=seq)


def _misplaced(seq: int, position: int, *, gap: bool) -> CorruptionError:
    """A row out of place: a gap in a whole log, else a seq not after the last one folded."""
    if gap:
        return CorruptionError(f"seq {seq} follows seq {position}: a gap in the log", seq=seq)
    return CorruptionError(f"seq {seq} is not after seq {position}", seq=seq)


def stream_start(candidate: CandidateState | None) -> LedgerState:
    """A state holding one candidate, to fold its stream's later events onto."""
    if candidate is None:
        return EMPTY
    return LedgerState(EMPTY.settings, {candidate.candidate_id: candidate}, candidate.last_seq)


def stale_rules(state: CandidateState) -> JSON | None:
    """The rules the candidate's latest check or hand-off recorded when they are not today's (else None):
    a decision made under other rules may not be the one today's would make."""
    decided = [d for d in (state.last_check, state.last_handoff) if d is not None]
    recorded = max(decided, key=lambda d: int(d["seq"])).get("rules") if decided else None
    return recorded if recorded is not None and recorded != RULES else None
