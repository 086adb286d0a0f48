"""Reading one stream's state: fold its events, or start from a checkpoint's copy.

The Ledger reads only the streams a command touches; these are the folds it uses,
and the trusted shortcut that lets a long-lived candidate be read as the latest
checkpoint's copy of its state plus the events after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import upcast
from lifecycle_fsm.fingerprint import CHECKPOINT_SCHEMA_VERSION, FINGERPRINT
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.state import CandidateState, LedgerSettings, apply_candidate, apply_settings, candidate_from_dict
from store.base import EventStore
from store.records import StoredEvent

__all__ = ["decoded_payload", "fold_candidate", "fold_settings", "state_from_checkpoint"]

log = get_logger(__name__)

JSON = dict[str, Any]


def fold_settings(events: Sequence[StoredEvent], start: LedgerSettings | None = None) -> LedgerSettings:
    """The ledger's settings from its own stream (or from `start` plus the events after it)."""
    settings = start or LedgerSettings()
    for e in events:
        with _corruption_at(e):
            settings = apply_settings(settings, e.type, decoded_payload(e), e.seq)
    return settings


def fold_candidate(events: Sequence[StoredEvent], start: CandidateState | None = None) -> CandidateState | None:
    """One candidate's state from its stream (or from `start` plus the events after it)."""
    state = start
    for e in events:
        with _corruption_at(e):
            state = apply_candidate(
                state, e.type, decoded_payload(e), seq=e.seq, stream_id=e.stream_id, version=e.version
            )
    return state


@contextmanager
def _corruption_at(event: StoredEvent) -> Iterator[None]:
    """A stored payload the fold cannot read is corruption at that seq, never a crash."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptionError(f"seq {event.seq}: {event.type} payload is unreadable ({e!r})", seq=event.seq) from e


def decoded_payload(e: StoredEvent) -> JSON:
    """A stored payload, parsed and upcast to the current schema version."""
    return upcast(e.type, e.schema_version, orjson.loads(e.payload), seq=e.seq)


def state_from_checkpoint(store: EventStore, stream_id: str) -> CandidateState | None:
    """The stream's state from the latest checkpoint, when it can be trusted.

    A long-lived candidate is then read as snapshot + tail, not its whole history.
    A stale or corrupt snapshot is skipped (and said so); the stream is folded.
    """
    snap = store.latest_stream_snapshot(stream_id)
    if snap is None:
        return None
    problem = None
    if snap.schema_version != CHECKPOINT_SCHEMA_VERSION or snap.fingerprint != FINGERPRINT:
        problem = "built by different code (fingerprint or schema version)"
    elif hashlib.sha256(snap.state.encode()).hexdigest() != snap.state_sha256:
        problem = "state does not match its sha256 (corrupt)"
    elif store.hash_at(snap.position) != snap.head_hash:
        problem = f"head hash at position {snap.position} does not match the log"
    if problem is None:
        try:
            state = candidate_from_dict(orjson.loads(snap.state))
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            problem = f"state cannot be read ({e!r})"
        else:
            if state.version == snap.version:
                return state
            problem = "state version differs from its row"
    log.warning("stream_snapshot_skipped", stream_id=stream_id, checkpoint_id=snap.checkpoint_id, reason=problem)
    return None
