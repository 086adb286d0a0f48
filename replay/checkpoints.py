"""Checkpoints: snapshots of the folded ledger at a position, verifiable and disposable.

One that does not match structurally (`lifecycle_fsm/snapshots.py`) is skipped, saying why, and an older
one or the whole log is folded instead; one built under other decision rules is used, with a warning:
rules decide what comes next, not what the recorded events fold to.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import orjson

from lifecycle_fsm.events import stream_of
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.replay.fold import EMPTY, LedgerState, fold_rows, index_of
from lifecycle_fsm.snapshots import (
    CHECKPOINT_SCHEMA_VERSION,
    FINGERPRINT,
    FINGERPRINT_PARTS,
    SnapshotProblem,
    other_rules,
    snapshot_problem,
)
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import CheckpointRecord

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "FINGERPRINT",
    "FINGERPRINT_PARTS",
    "LoadResult",
    "checkpoint_problem",
    "load_state",
    "take_checkpoint",
]

log = get_logger(__name__)


@attrs.frozen
class LoadResult:
    """A loaded state, the checkpoint it started from (if any) and the ones skipped, with why."""

    state: LedgerState
    checkpoint: CheckpointRecord | None
    skipped: tuple[tuple[int, str], ...] = ()


def take_checkpoint(store: EventStore, *, clock: Callable[[], str], to: int | None = None) -> CheckpointRecord:
    """Snapshot the folded ledger at the head (or `to`) and bring the state index to it. Each row folded
    is re-hashed first: a snapshot of a row edited in place would make every later read believe it."""
    state = load_state(store, to=to, checked=True).state
    return store.append_checkpoint(
        position=state.position,
        schema_version=CHECKPOINT_SCHEMA_VERSION,
        fingerprint=FINGERPRINT,
        snapshot=state.snapshot(),
        recorded_at=clock(),
        streams=[
            (stream_of(cid), c.version, canonical_json(c.to_dict())) for cid, c in sorted(state.candidates.items())
        ],
        index=index_of(state),
    )


def checkpoint_problem(store: EventStore, record: CheckpointRecord) -> SnapshotProblem | None:
    """Why a checkpoint cannot be trusted, or None when it can (see `snapshot_problem`)."""
    return snapshot_problem(store, record, record.snapshot, record.snapshot_sha256)


def _restore(record: CheckpointRecord) -> LedgerState:
    data = orjson.loads(record.snapshot)
    if data["position"] != record.position:
        raise ValueError("snapshot position differs from its row")
    return LedgerState.from_json(data)


def load_state(
    store: EventStore, *, to: int | None = None, use_checkpoints: bool = True, checked: bool = False
) -> LoadResult:
    """The latest trusted checkpoint at or before `to` plus the events after it (`checked`: see `fold_rows`)."""
    skipped: list[tuple[int, str]] = []
    for record in store.select_checkpoints(at_or_before=to) if use_checkpoints else ():
        problem = checkpoint_problem(store, record)
        reason = None if problem is None else problem.reason
        if problem is None:
            try:
                start = _restore(record)
            except (ValueError, KeyError, TypeError) as e:
                reason = f"snapshot cannot be read ({e!r})"
            else:
                if (rules := other_rules(record.fingerprint)) is not None:
                    log.warning("checkpoint_other_rules", checkpoint_id=record.checkpoint_id, rules=rules)
                return LoadResult(fold_rows(store, start, to=to, checked=checked), record, tuple(skipped))
        log.warning("checkpoint_skipped", checkpoint_id=record.checkpoint_id, position=record.position, reason=reason)
        skipped.append((record.checkpoint_id, str(reason)))
    return LoadResult(fold_rows(store, EMPTY, to=to, checked=checked), None, tuple(skipped))
