"""Checkpoints: snapshots of the folded ledger, verifiable and disposable.

A checkpoint stores the state at global position N, the chain's hash at N, a schema
version and a fingerprint of what the folded state structurally depends on
(`lifecycle_fsm/snapshots.py`). Like a training run's resume checkpoints, a structural
mismatch means the snapshot is not used and the reason is said; the ledger then
falls back to an older checkpoint or a full replay. One built under other decision
rules is used, with a warning (`checkpoint_other_rules`): rules decide what comes next,
not what the recorded events fold to. Loading is the latest trusted
checkpoint plus the events after it, and must equal a full replay
(tests/test_checkpoints.py and tests/test_properties.py prove it).
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
    "SnapshotProblem",
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
    """Snapshot the folded ledger at the head (or `to`), starting from the latest good checkpoint; the
    state index is brought to the same state (the one place it moves besides a rebuild). Each row folded
    is re-hashed first: a snapshot of a row edited in place would make every later read believe it."""
    loaded = load_state(store, to=to, checked=True)
    streams = [
        (stream_of(cid), c.version, canonical_json(c.to_dict())) for cid, c in sorted(loaded.state.candidates.items())
    ]
    return store.append_checkpoint(
        position=loaded.state.position,
        schema_version=CHECKPOINT_SCHEMA_VERSION,
        fingerprint=FINGERPRINT,
        snapshot=loaded.state.snapshot(),
        recorded_at=clock(),
        streams=streams,
        index=index_of(loaded.state),
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
    """Latest trusted checkpoint at or before `to` plus the events after it.

    `checked`: recompute each folded row's own hash first (`fold_rows`), as reads that
    print state do.
    """
    skipped: list[tuple[int, str]] = []
    if use_checkpoints:
        for record in store.select_checkpoints(at_or_before=to):
            problem = checkpoint_problem(store, record)
            reason = None if problem is None else problem.reason
            if problem is None:
                try:
                    start = _restore(record)
                except (ValueError, KeyError, TypeError) as e:
                    reason = f"snapshot cannot be read ({e!r})"
                else:
                    if (rules := other_rules(record.fingerprint)) is not None:  # decisions, not structure: used
                        log.warning("checkpoint_other_rules", checkpoint_id=record.checkpoint_id, rules=rules)
                    return LoadResult(fold_rows(store, start, to=to, checked=checked), record, tuple(skipped))
            log.warning(
                "checkpoint_skipped", checkpoint_id=record.checkpoint_id, position=record.position, reason=reason
            )
            skipped.append((record.checkpoint_id, str(reason)))
    return LoadResult(fold_rows(store, EMPTY, to=to, checked=checked), None, tuple(skipped))
