"""Why a candidate is where it is: the decisive event and its evidence, at any position.

An auditor asks "why was this rejected?" months later. The answer is folded from
the candidate's own stream up to `as_of` (pure, no clock), and names the event that
moved it into its state: its seq, type, who recorded it, and the evidence it
carried (expected vs actual hashes, versions, window age, failed checks).
"""

from __future__ import annotations

from typing import Any

from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.streams import fold_candidate
from lifecycle_fsm.upcasting import decoded_payload
from store.base import EventStore
from store.records import StoredEvent

__all__ = ["explain"]

JSON = dict[str, Any]


def _event_json(event: StoredEvent) -> JSON:
    return {
        "seq": event.seq,
        "type": event.type,
        "version": event.version,
        "recorded_at": event.recorded_at,
        "actor": event.actor,
        "evidence": decoded_payload(event),
    }


def explain(store: EventStore, candidate_id: str, *, as_of: int | None = None) -> JSON:
    """The candidate's state, reason codes and decisive event as of a global position."""
    events = [e for e in store.read_stream(stream_of(candidate_id)) if as_of is None or e.seq <= as_of]
    if not events:
        where = "" if as_of is None else f" at or before seq {as_of}"
        raise NotFoundError(f"unknown candidate: {candidate_id!r}{where}")
    state = fold_candidate(events)
    assert state is not None
    by_seq = {e.seq: e for e in events}
    decisive = by_seq[state.decisive_seq] if state.decisive_seq is not None else events[-1]
    last_check = state.last_check
    return {
        "id": state.candidate_id,
        "kind": state.kind,
        "state": state.state,
        "version": state.version,
        "as_of": as_of if as_of is not None else events[-1].seq,
        "reason_codes": list(state.reason_codes),
        "decisive_event": _event_json(decisive),
        "last_check_seq": None if last_check is None else last_check["seq"],
        "trusted_states": state.trusted_states,
        "history": [{"seq": e.seq, "type": e.type, "recorded_at": e.recorded_at, "actor": e.actor} for e in events],
    }
