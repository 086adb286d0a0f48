"""What commands return: a candidate that is never None (`ledger.check(cid).state` needs no assert), a
typed plan, settings; and what a retried idempotency key returns.

A retried command (`duplicate`) returns the events its first call appended and the candidate as that
call left it, appending nothing. A command keyed `KEY` stores its events as `KEY`, `KEY/1`, `KEY/2`, …
in one transaction (a settings change's fan-out continues the numbering), so a retry finds all of them.
The same key with another stream, event type or inputs is a `DuplicateEventError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import orjson

from lifecycle_fsm.candidate_events import EvidenceInvalidated
from lifecycle_fsm.errors import DuplicateEventError
from lifecycle_fsm.events import LEDGER_STREAM, candidate_id_of
from lifecycle_fsm.machine import State
from lifecycle_fsm.rules import RecoveryPlan
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.records import StoredEvent
from lifecycle_fsm.streams import fold_candidate, fold_settings

if TYPE_CHECKING:
    from lifecycle_fsm.command_path import CommandPath


@attrs.frozen(kw_only=True)
class CandidateResult:
    """A candidate command's outcome: the candidate as this command left it (for a retry, as the first call did)."""

    candidate: CandidateState
    events: tuple[StoredEvent, ...] = ()
    duplicate: bool = False

    @property
    def state(self) -> State:
        return self.candidate.state

    @property
    def candidate_id(self) -> str:
        return self.candidate.candidate_id

    @property
    def appended(self) -> bool:
        """Whether this call appended events (False for a no-op or a retried `event_id`)."""
        return bool(self.events) and not self.duplicate

    @property
    def inconclusive(self) -> bool:
        """Whether a check or hand-off could not read an artifact (the environment's fault): nothing decided."""
        return any(e.type == "InconclusiveCheckRecorded" for e in self.events)


@attrs.frozen(kw_only=True)
class RecoveryResult(CandidateResult):
    """`fail_stage`'s outcome: the candidate (recovering, or reject when blocked) and the plan."""

    plan: RecoveryPlan


@attrs.frozen(kw_only=True)
class SettingsResult:
    """A settings command's outcome; `invalidated` names the candidates it sent back to `received`."""

    settings: LedgerSettings
    events: tuple[StoredEvent, ...] = ()
    duplicate: bool = False
    invalidated: tuple[str, ...] = ()

    @property
    def appended(self) -> bool:
        """Whether this call appended events (False for a no-op or a retried `event_id`)."""
        return bool(self.events) and not self.duplicate


# Any command's outcome (what the CLI renders).
CommandResult: TypeAlias = CandidateResult | SettingsResult


def stored_field(event: StoredEvent, key: str) -> Any:
    """One field of a stored payload (None when absent or unreadable): for logs and look-ups, never a fold."""
    try:
        payload = orjson.loads(event.payload)
    except orjson.JSONDecodeError:
        return None
    return payload.get(key) if isinstance(payload, dict) else None


def replayed(
    path: CommandPath,
    event_id: str | None,
    stream_id: str,
    type_name: str,
    inputs: Mapping[str, Any],
    then_types: Sequence[str] = (),
) -> CommandResult | None:
    """What the command keyed `event_id` did, as it left things, when it is this same command; None when
    the key is new."""
    if event_id is None:
        return None
    first = path.store.event_by_id(event_id)
    if first is None:
        return None
    payload = orjson.loads(first.payload)
    same_inputs = all(payload.get(key) == value for key, value in inputs.items())
    if first.stream_id != stream_id or first.type != type_name or not same_inputs:
        raise DuplicateEventError(
            f"event id {event_id!r} is already used at seq {first.seq} by {first.type} on {first.stream_id}: "
            "a key names one command in the whole ledger; give this command a new one",
            event_id=event_id,
            seq=first.seq,
        )
    events = tuple(_command_events(path, event_id, first, then_types))
    if stream_id == LEDGER_STREAM:
        settings = path.reader.settings()
        if settings.version != events[0].version:  # changed since
            settings = fold_settings(path.store.read_stream(LEDGER_STREAM)[: events[0].version])
        invalidated = tuple(cid for e in events if (cid := candidate_id_of(e.stream_id)) is not None)
        return SettingsResult(settings=settings, events=events, invalidated=invalidated, duplicate=True)
    candidate = path.reader.candidate(stream_id)
    if candidate is not None and candidate.version != events[-1].version:  # moved on since
        candidate = fold_candidate(path.store.read_stream(stream_id)[: events[-1].version])
    assert candidate is not None
    return CandidateResult(candidate=candidate, events=events, duplicate=True)


def retried_unread(
    path: CommandPath, event_id: object, type_name: str, manifest_path: str, candidate_id: str | None = None
) -> CommandResult | None:
    """A keyed receive or baseline activation retried once its manifest is gone: the stored answer when
    that key recorded this manifest path (and id), else None. Only a retry is helped."""
    first = path.store.event_by_id(event_id) if isinstance(event_id, str) else None
    if first is None or first.type != type_name:
        return None
    match: dict[str, Any] = {"manifest_path": os.path.normpath(os.path.abspath(manifest_path))}
    if candidate_id is not None:
        match["candidate_id"] = candidate_id
    payload = orjson.loads(first.payload)
    if any(payload.get(key) != value for key, value in match.items()):
        return None
    return replayed(path, first.event_id, first.stream_id, type_name, match)


def _command_events(
    path: CommandPath, event_id: str, first: StoredEvent, then_types: Sequence[str]
) -> list[StoredEvent]:
    """`first` and the events keyed `event_id/1`, `event_id/2`, … its command appended with it: in one
    transaction, so its n-th further event is at seq `first.seq + n`, of the kind that command appends
    there (a candidate command's `then_types` on its stream, a settings command's fan-out)."""
    events = [first]
    on_ledger = first.stream_id == LEDGER_STREAM
    while on_ledger or len(events) <= len(then_types):
        n = len(events)
        nxt = path.store.event_by_id(f"{event_id}/{n}")
        if nxt is None or nxt.seq != first.seq + n:
            break
        if on_ledger:
            own = nxt.type == EvidenceInvalidated.TYPE and candidate_id_of(nxt.stream_id) is not None
        else:
            own = (nxt.stream_id, nxt.version, nxt.type) == (first.stream_id, first.version + n, then_types[n - 1])
        if not own:
            break
        events.append(nxt)
    return events
