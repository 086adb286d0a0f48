"""Whole-ledger replay: the log after a position, read in batches and folded by `state.fold` (a gap is corruption)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.state import EMPTY, LedgerState, Row, fold
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import check_rows
from lifecycle_fsm.store.records import EventFilter, StreamHead
from lifecycle_fsm.upcasting import edited_row_error

__all__ = ["EMPTY", "LedgerState", "fold_rows", "index_of", "snapshot_json"]


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
