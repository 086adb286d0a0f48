"""Whole-ledger replay: the log read from the store in batches and folded onto a starting state.

The fold itself is `lifecycle_fsm.state.fold`, the one every command and read uses; here it
reads the whole log after a position (`whole_log`: a gap is corruption), optionally with each
row's own hash recomputed first, as the reads that print state do (fail closed).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.state import EMPTY, LedgerState, Row, fold
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import check_rows
from lifecycle_fsm.store.records import EventFilter, StreamHead
from lifecycle_fsm.upcasting import edited_row_error

__all__ = ["EMPTY", "LedgerState", "fold_rows", "index_of", "log_batches", "snapshot_json"]


def index_of(state: LedgerState) -> list[StreamHead]:
    """The stream index a fold implies (what `replay --full` rebuilds the index from)."""
    heads = [
        StreamHead(stream_of(cid), c.version, c.state.value, c.kind if isinstance(c.kind, str) else None)
        for cid, c in sorted(state.candidates.items())
    ]
    if state.settings.version:
        heads.append(StreamHead(LEDGER_STREAM, state.settings.version, None, None))
    heads.extend(StreamHead(sid, version, None, None) for sid, version in sorted(state.streams.items()))
    return sorted(heads, key=lambda h: h.stream_id)


def snapshot_json(state: LedgerState) -> str:
    """The canonical text of a state (`LedgerState.snapshot`)."""
    return state.snapshot()


def log_batches(store: EventStore, *, after: int, to: int | None, checked: bool) -> Iterable[Sequence[Row]]:
    """The log after `after` (up to `to`) in batches of fold rows; `checked`: each row's own hash recomputed first."""
    before = None if to is None else to + 1
    if checked:
        return check_rows(store.select_rows(EventFilter(after=after, before=before)), error=edited_row_error)
    return store.select_fold_rows(after=after, before=before)


def fold_rows(
    store: EventStore,
    start: LedgerState = EMPTY,
    *,
    to: int | None = None,
    checked: bool = False,
    batches: Iterable[Sequence[Row]] | None = None,
) -> LedgerState:
    """Fold the log after `start.position` (up to `to`) onto `start`.

    `batches`: rows already checked by the caller (`verify` hands on its chain walk's).
    The batches are chained, not copied row by row: a fold row is any sequence of its six columns.
    """
    if batches is None:
        batches = log_batches(store, after=start.position, to=to, checked=checked)
    return fold(itertools.chain.from_iterable(batches), start, whole_log=True)
