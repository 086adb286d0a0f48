"""Whole-ledger replay and its checkpoints: snapshots of the folded ledger at a position, verifiable and disposable.

The log after a position is read in batches and folded by `state.fold` (a gap is corruption).

One that does not match structurally (`lifecycle_fsm/snapshots.py`) is skipped, saying why, and an older
one or the whole log is folded instead; one built under other decision rules is used, with a warning:
rules decide what comes next, not what the recorded events fold to.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

import attrs
import orjson

from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.snapshots import (
    CHECKPOINT_SCHEMA_VERSION,
    FINGERPRINT,
    FINGERPRINT_PARTS,
    other_rules,
    snapshot_problem,
)
from lifecycle_fsm.state import EMPTY, LedgerState, Row, fold
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import canonical_json, check_rows
from lifecycle_fsm.store.records import CheckpointRecord, EventFilter, StreamHead
from lifecycle_fsm.upcasting import edited_row_error

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "EMPTY",
    "FINGERPRINT",
    "FINGERPRINT_PARTS",
    "LedgerState",
    "LoadResult",
    "fold_rows",
    "index_of",
    "load_state",
    "snapshot_json",
    "take_checkpoint",
]

log = get_logger(__name__)


def index_of(state: LedgerState) -> list[StreamHead]:
    """The stream index a fold implies (what `replay --full` rebuilds the index from)."""
    heads = [
        StreamHead(stream_of(cid), c.version, c.state.value, c.kind if isinstance(c.kind, str) else None)
        for cid, c in state.candidates.items()
    ]
    if state.settings.version:
        heads.append(StreamHead(LEDGER_STREAM, state.settings.version, None, None))
    heads.extend(StreamHead(sid, version, None, None) for sid, version in state.streams.items())
    return sorted(heads, key=lambda h: h.stream_id)


def snapshot_json(state: LedgerState) -> str:
    """The canonical text of a state (`LedgerState.snapshot`)."""
    return state.snapshot()


def fold_rows(
    store: EventStore,
    start: LedgerState = EMPTY,
    *,
    to: int | None = None,
    checked: bool = False,
    batches: Iterable[Sequence[Row]] | None = None,
) -> LedgerState:
    """Fold the log after `start.position` (up to `to`) onto `start`.

    `checked`: each row's own hash recomputed first, as reads that print state do (fail closed).
    `batches`: rows already checked by the caller (`verify` hands on its chain walk's).
    """
    if batches is None:
        before = None if to is None else to + 1
        if checked:
            batches = check_rows(
                store.select_rows(EventFilter(after=start.position, before=before)), error=edited_row_error
            )
        else:
            batches = store.select_fold_rows(after=start.position, before=before)
    return fold(itertools.chain.from_iterable(batches), start, whole_log=True)


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


def load_state(
    store: EventStore, *, to: int | None = None, use_checkpoints: bool = True, checked: bool = False
) -> LoadResult:
    """The latest trusted checkpoint at or before `to` plus the events after it (`checked`: see `fold_rows`)."""
    skipped: list[tuple[int, str]] = []
    for record in store.select_checkpoints(at_or_before=to) if use_checkpoints else ():
        problem = snapshot_problem(store, record, record.snapshot, record.snapshot_sha256)
        reason = None if problem is None else problem.reason
        if problem is None:
            try:
                data = orjson.loads(record.snapshot)
                if data["position"] != record.position:
                    raise ValueError("snapshot position differs from its row")
                start = LedgerState.from_json(data)
            except (ValueError, KeyError, TypeError) as e:
                reason = f"snapshot cannot be read ({e!r})"
            else:
                if (rules := other_rules(record.fingerprint)) is not None:
                    log.warning("checkpoint_other_rules", checkpoint_id=record.checkpoint_id, rules=rules)
                return LoadResult(fold_rows(store, start, to=to, checked=checked), record, tuple(skipped))
        log.warning("checkpoint_skipped", checkpoint_id=record.checkpoint_id, position=record.position, reason=reason)
        skipped.append((record.checkpoint_id, str(reason)))
    return LoadResult(fold_rows(store, EMPTY, to=to, checked=checked), None, tuple(skipped))
