"""`verify`'s work shared among worker processes: the chain in slices, the fold by streams.

Each row stores its `prev_hash`, so a worker walks its slice of positions trusting only its first row's
link, and the slices are joined after (each first row walked on from the previous slice's last): the
first break is the one a single walk meets. A candidate's stream folds on its own, so each worker folds
a share of the streams; the first corruption is the lowest seq any share met. The workers are forked
and each opens its own store on the target, never the one this process holds.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import multiprocessing
import operator
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import attrs

from lifecycle_fsm.errors import CorruptionError, LifecycleError, StoreError
from lifecycle_fsm.events import LEDGER_STREAM
from lifecycle_fsm.replay.verify import Folded
from lifecycle_fsm.state import Fold, LedgerState, Row
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import GENESIS_HASH, ChainWalk
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.records import ChainReport, EventFilter, Head, StreamHead, StreamShare

__all__ = ["walk_shared"]

_seq = operator.itemgetter(0)


@attrs.frozen
class _Share:
    """A worker's results: its slice's first row, and the break its walk met (`bad`) or the walk's report;
    its streams' states at each position and the head, or what stopped the fold."""

    first: Row | None
    bad: tuple[int, str] | None
    walked: ChainReport | None
    states: list[LedgerState]
    failed: Exception | None


def _fold_share(batches: Iterator[list[Row]], positions: Sequence[int]) -> list[LedgerState]:
    """The share's state after its rows up to each of `positions` (ascending), then after all of them."""
    folding = Fold()
    states: list[LedgerState] = []
    marks = list(positions)
    for rows in batches:
        start = 0
        while marks and rows and _seq(rows[-1]) > marks[0]:
            cut = bisect.bisect_right(rows, marks.pop(0), lo=start, key=_seq)
            folding.extend(rows[start:cut])
            states.append(folding.result())
            start = cut
        folding.extend(rows[start:])
    final = folding.result()
    return [*states, *(final for _ in marks), final]


def _run_share(
    target: str, head: int, bounds: tuple[int, int], streams: StreamShare, positions: list[int]
) -> _Share | str:
    """In a worker: the slice `bounds` of the chain and the fold of this share's streams up to `head`;
    a message when the ledger cannot be read there."""
    try:
        with contextlib.closing(open_store(target, create=False)) as store:
            return _walk_and_fold(store, head, bounds, streams, positions)
    except LifecycleError as e:
        return str(e)


def _walk_and_fold(
    store: EventStore, head: int, bounds: tuple[int, int], streams: StreamShare, positions: list[int]
) -> _Share:
    """The share's rows read as fold columns, but in the worker's own slice the rows its walk has just
    checked (each row read once)."""
    after, upto = bounds
    batches = iter(store.select_rows(EventFilter(after=after, before=upto + 1)))
    head_batch = next(batches, [])
    first = head_batch[0] if head_batch else None
    start = None if first is None else Head(first[0] - 1, first[9])
    walk = ChainWalk(itertools.chain([head_batch], batches), start=start, times=True)
    own = itertools.chain(
        store.select_fold_rows(after=0, before=after + 1, streams=streams),
        ([row for row in rows if streams.holds(row[1])] for rows in walk.fold_batches()),
        store.select_fold_rows(after=upto, before=head + 1, streams=streams),
    )
    states: list[LedgerState] = []
    failed: Exception | None = None
    try:
        states = _fold_share(own, positions)
    except CorruptionError as e:  # a finding
        failed = e
    except LifecycleError:
        raise
    except Exception as e:  # rows the chain may not hold (a column edited to another type): judged after it
        failed = e
    walk.finish()
    bad = None if walk.bad_seq is None or walk.reason is None else (walk.bad_seq, walk.reason)
    # No break: the report asks the store nothing.
    walked = walk.report(count=store.count_events, head=store.head) if first is not None and bad is None else None
    return _Share(first, bad, walked, states, failed)


def _share_out(index: list[StreamHead], workers: int) -> list[StreamShare]:
    """The streams' shares: the longest first (by the index's versions), each to the share with the fewest
    events so far. Share 0 is every stream but the others', so a stream the index does not list is folded."""
    events = [0] * workers
    names: list[set[str]] = [set() for _ in range(workers)]
    for head in sorted(index, key=lambda h: -_length(h)):
        share = events.index(min(events))
        names[share].add(head.stream_id)
        events[share] += _length(head)
    others = frozenset(itertools.chain.from_iterable(names[1:]))
    return [StreamShare(others, others=True), *(StreamShare(frozenset(n)) for n in names[1:])]


def _length(head: StreamHead) -> int:
    return head.version if type(head.version) is int else 1


def walk_shared(store: EventStore, workers: int, target: str, positions: list[int]) -> tuple[ChainReport, Folded]:
    """`verify`'s walk by worker processes on the ledger at `target`, each over a slice of the chain and a share
    of the streams, stopping at each of `positions` (ascending): the chain's verdict as one walk gives it, and
    the merged states at each position and the head, or the first corruption (None: the chain is broken).
    The head is read here, so the workers and this process judge the same log."""
    head = store.head().seq
    shares = _share_out(store.streams(), workers)
    size = -(-head // workers)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [
            pool.submit(_run_share, target, head, (min(k * size, head), min(k * size + size, head)), s, positions)
            for k, s in enumerate(shares)
        ]
        found = [future.result() for future in futures]
    except BrokenProcessPool as e:  # a worker killed
        raise StoreError(f"verify's worker processes stopped before they finished ({e})") from e
    finally:
        pool.shutdown(cancel_futures=True)
    for part in found:
        if isinstance(part, str):
            raise StoreError(f"a verify worker could not read the ledger: {part}")
    parts = [part for part in found if isinstance(part, _Share)]
    chain = _chain(parts, count=store.count_events, head=store.head)
    if not chain.ok:
        return chain, None
    failures = [part.failed for part in parts if part.failed is not None]
    if corrupt := [e for e in failures if isinstance(e, CorruptionError)]:
        return chain, min(corrupt, key=lambda e: e.seq or 0)  # the row one whole fold stops at
    if failures:
        raise failures[0]
    ledger_share = next(k for k, share in enumerate(shares) if share.holds(LEDGER_STREAM))
    merged = [
        _merge([part.states[n] for part in parts], position, settings_from=ledger_share)
        for n, position in enumerate([*positions, head])
    ]
    return chain, merged


def _chain(shares: list[_Share], *, count: Callable[[], int], head: Callable[[], Head]) -> ChainReport:
    """The slices joined: each slice's first row walked on from the previous slice's last (position, link),
    then the slice's own finding, so the first break is the one a walk over the whole log meets."""
    last, seen = Head(0, GENESIS_HASH), 0
    for part in shares:
        if part.first is None:  # no rows at all: the next row's position says where they went
            continue
        boundary = ChainWalk([[part.first]], start=last, hashes=False)
        boundary.finish()
        bad = part.bad if boundary.bad_seq is None or boundary.reason is None else (boundary.bad_seq, boundary.reason)
        if bad is not None:
            return ChainReport(False, count(), head(), bad_seq=bad[0], reason=bad[1])
        assert part.walked is not None
        last, seen = part.walked.head, seen + part.walked.events
    return ChainReport(True, seen, last)


def _merge(parts: list[LedgerState], position: int, *, settings_from: int) -> LedgerState:
    """The shares' states at one position as one state (candidates in id order)."""
    candidates = dict(sorted((item for part in parts for item in part.candidates.items()), key=_seq))
    streams = {sid: version for part in parts for sid, version in part.streams.items()}
    return LedgerState(parts[settings_from].settings, candidates, position, streams)
