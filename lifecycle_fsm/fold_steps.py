"""What the fold checks of one stored event, and a candidate event's step.

A payload has every field of its event's class and nothing else; a field of the wrong type is
corruption at that seq, never a crash; a candidate event makes a move the machine's table
allows, at the next version of its stream. `state.Fold` applies these to each row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import CANDIDATE_EVENTS, LEDGER_EVENTS, CandidateEvent
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.machine import TABLE, allowed_triggers

__all__ = ["CANDIDATE_STEPS", "CandidateStep", "IllegalTransition", "check_fields", "reading_stored"]


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


FIELDS = {
    name: frozenset(a.name for a in attrs.fields(cls)) for name, cls in {**LEDGER_EVENTS, **CANDIDATE_EVENTS}.items()
}

# What reading a stored payload of the wrong shape raises: corruption at that seq, never a crash.
_UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, IndexError)


@contextmanager
def reading_stored(seq: int, type_name: str) -> Iterator[None]:
    """Interpret a stored payload beside the fold (explain, history, log): a field missing or of the
    wrong type is corruption at that seq, as it is in the fold, never a crash."""
    try:
        yield
    except _UNREADABLE as e:
        raise _unreadable(seq, type_name, e) from e


def _unreadable(seq: int, type_name: str, error: Exception) -> CorruptionError:
    return CorruptionError(f"seq {seq}: {type_name} payload is unreadable ({error!r})", seq=seq)


def check_fields(seq: int, type_name: str, payload: Mapping[str, Any]) -> None:
    """Every field of the event's class, nothing else: a stored payload is never guessed at."""
    fields = FIELDS[type_name]
    if payload.keys() != fields:
        missing, extra = sorted(fields - payload.keys()), sorted(payload.keys() - fields)
        raise CorruptionError(
            f"seq {seq}: {type_name} payload does not match its schema (missing {missing}, unexpected {extra})",
            seq=seq,
        )


@attrs.frozen
class CandidateStep:
    """A candidate event's class as the fold applies it, read off the class once. What the event does
    is its class's (`trigger_for`, `evolve`, `reasons`); this spares each event the look-ups through
    the class hierarchy and the calls to the no-ops a class inherits (None here)."""

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
            fields=FIELDS[event.TYPE],
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
        try:
            trigger = self.fixed_trigger or self.trigger_for(payload)
        except _UNREADABLE as e:
            raise _unreadable(seq, self.type_name, e) from e
        dest = TABLE.get((state, trigger))
        if dest is None:
            raise IllegalTransition(
                seq=seq, stream_id=stream_id, state=state, trigger=trigger, type_name=self.type_name
            )
        expected = 1 if work is None else work["version"] + 1
        if version != expected:
            message = f"seq {seq}: stream {stream_id} jumps to version {version}, expected {expected}"
            raise CorruptionError(message, seq=seq)
        try:
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


CANDIDATE_STEPS = {name: CandidateStep.of(cls) for name, cls in CANDIDATE_EVENTS.items()}
