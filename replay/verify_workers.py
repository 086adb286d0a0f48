"""The chain's row hashes re-computed by worker processes, each over a slice of the log.

Each row stores its `prev_hash`, so a row's own hash can be checked without its
predecessor: workers walk slices of positions with `ChainWalk(start=None)` (each row's
own hash), while `verify` walks the whole log in order for positions and links only
(`ChainWalk(hashes=False)`) and folds it. The first break is the lowest position either
found; at the same position the in-order walk's finding comes first, as one walk's
checks come in that order (position, link, then hash).

The workers are forked, so they import nothing: each opens its own store on the target and
never touches the one this process holds (the store's handle is kept for its owner across a
fork), and multiprocessing ends them without running their inherited finalisers.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from lifecycle_fsm.errors import LifecycleError, StoreError
from lifecycle_fsm.store.chain import ChainWalk
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.records import EventFilter

__all__ = ["HashWorkers"]

_SLICES_PER_WORKER = 4  # a few slices each, so one slow slice does not hold the rest back


def _slice_problem(target: str, after: int, upto: int) -> tuple[int, str] | str | None:
    """In a worker: the first row in `(after, upto]` whose own hash does not hold, as (seq, reason);
    a message when the ledger cannot be read there; None when every row holds."""
    try:
        store = open_store(target, create=False)
        try:
            walk = ChainWalk(store.select_rows(EventFilter(after=after, before=upto + 1)), start=None)
            walk.finish()
        finally:
            store.close()
    except LifecycleError as e:
        return str(e)
    return None if walk.bad_seq is None or walk.reason is None else (walk.bad_seq, walk.reason)


class HashWorkers:
    """Worker processes checking the row hashes of positions `(0, head]` of the ledger at `target`."""

    def __init__(self, target: str, head: int, workers: int) -> None:
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        size = max(1, -(-head // (workers * _SLICES_PER_WORKER)))
        self._slices: list[Future[tuple[int, str] | str | None]] = [
            self._pool.submit(_slice_problem, target, after, min(after + size, head)) for after in range(0, head, size)
        ]

    def first_problem(self) -> tuple[int, str] | None:
        """Wait for every slice: the lowest position whose own hash does not hold, with the reason."""
        try:
            found = [s.result() for s in self._slices]
        except BrokenProcessPool as e:  # a worker killed
            raise StoreError(f"verify's worker processes stopped before they finished ({e})") from e
        finally:
            self._pool.shutdown(cancel_futures=True)
        breaks: list[tuple[int, str]] = []
        for problem in found:
            if isinstance(problem, str):
                raise StoreError(f"a verify worker could not read the ledger: {problem}")
            if problem is not None:
                breaks.append(problem)
        return min(breaks, default=None)

    def cancel(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
