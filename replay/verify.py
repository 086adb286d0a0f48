"""Proving the log was not edited: the hash chain, the checkpoints, the derived indexes and replay legality.

The log is read once: the fold takes its rows from the chain walk (`chain.ChainWalk`), which hands on only
rows it has just checked, so a broken chain is the finding whatever the fold met first. A stale checkpoint
(built by other code) is reported, not a failure; a corrupt one is. With worker processes
(`walk_shared`) the report is the same, found in shares.

The workers' share: each row stores its `prev_hash`, so a worker walks its slice of positions trusting only
its first row's link, and the slices are joined after (each first row walked on from the previous slice's
last): the first break is the one a single walk meets. A candidate's stream folds on its own, so each worker
folds a share of the streams; the first corruption is the lowest seq any share met. The workers are forked
and each opens its own store on the target, never the one this process holds (`multiprocessing` is
imported only then).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

from lifecycle_fsm.errors import CorruptionError, LifecycleError, StoreError
from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.findings import add_problem, problem
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.checkpoints import EMPTY, LedgerState, fold_rows, index_of, snapshot_json
from lifecycle_fsm.snapshots import snapshot_problem
from lifecycle_fsm.state import Fold, Row
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import GENESIS_HASH, ChainWalk, canonical_json, snapshot_digest
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.records import ChainReport, CheckpointRecord, EventFilter, Head, StreamHead, StreamShare

REBUILD = "rebuild it with `lifecycle replay --full`"
_seq = operator.itemgetter(0)
Folded = list[LedgerState] | CorruptionError | None  # the states at each stop and the head, or what stopped the fold


def _checkpoint_statuses(store: EventStore) -> tuple[dict[int, JSON], list[CheckpointRecord]]:
    """Each checkpoint's status on its own, and the sound ones, which `_compare` holds against the replay."""
    reports: dict[int, JSON] = {}
    sound = []
    for record in store.select_checkpoints():
        problem = snapshot_problem(store, record, record.snapshot, record.snapshot_sha256)
        if problem is None:
            sound.append(record)
        reports[record.checkpoint_id] = {
            "checkpoint_id": record.checkpoint_id,
            "position": record.position if type(record.position) is int else None,  # none: edited by hand
            # stale: built by other code, not used, not corrupt
            "status": "ok" if problem is None else "stale" if problem.stale else "broken",
            "reason": None if problem is None else problem.reason,
        }
    return reports, sound


def _compare(store: EventStore, report: JSON, record: CheckpointRecord, state: LedgerState) -> None:
    """A sound checkpoint against the replay at its position: its snapshot, then each stream's copy."""
    if snapshot_json(state) != record.snapshot:
        report.update(status="broken", reason="snapshot differs from a full replay")
        return
    snaps = store.stream_snapshots(record.checkpoint_id)
    # A copy whose digest does not hold is one `status ID` skips as corrupt: broken here too, not "ok".
    corrupt = [s.stream_id for s in snaps if not isinstance(s.state, str) or s.state_sha256 != snapshot_digest(s.state)]
    expected = {stream_of(cid): canonical_json(c.to_dict()) for cid, c in state.candidates.items()}
    copies = {snap.stream_id: snap.state for snap in snaps}
    if corrupt:
        reason = f"stream copy does not match its sha256 (corrupt): {', '.join(sorted(corrupt)[:5])}"
        report.update(status="broken", reason=reason)
    elif copies != expected:
        reason = f"stream copies differ from a full replay: {', '.join(_differing(expected, copies)[:5])}"
        report.update(status="broken", reason=reason)


def _differing(expected: Mapping[str, object], found: Mapping[str, object]) -> list[str]:
    return sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))


def _index_problem(
    position: int, stored: list[StreamHead], at_index: LedgerState, head: int, checkpointed: int
) -> JSON | None:
    """The state index (`streams`) must equal, row for row, a replay to the position it reflects: behind the
    head at most, never behind the latest sound checkpoint (each brings it to its own position)."""
    if not checkpointed <= position <= head:
        where = f"past the log's head {head}" if position > head else f"behind the checkpoint at {checkpointed}"
        reason = f"state index (streams) reflects position {position}, {where} (rows were removed or edited)"
        return problem("state_index", None, reason, advice=REBUILD)
    expected = {h.stream_id: h for h in index_of(at_index)}
    rows = {h.stream_id: h for h in stored}
    if rows == expected:
        return None
    differing = _differing(expected, rows)
    first = differing[0]
    reason = (
        f"state index (streams) differs from a replay to its position {position} at {', '.join(differing[:5])}: "
        f"{first} is {_row(rows.get(first))} in the index, {_row(expected.get(first))} in the log"
    )
    return problem("state_index", None, reason, advice=REBUILD)


def _row(head: StreamHead | None) -> str:
    return "missing" if head is None else f"version {head.version} status {head.status} kind {head.category}"


def verify(store: EventStore, *, workers: int = 1, target: str | None = None) -> JSON:
    """The integrity report `lifecycle verify` prints; `ok` is False if anything is broken. With `workers` > 1
    and the ledger's `target` (its file or URL), worker processes share the walk and the fold."""
    return verify_with_state(store, workers=workers, target=target)[0]


def verify_with_state(
    store: EventStore, *, workers: int = 1, target: str | None = None
) -> tuple[JSON, LedgerState | None]:
    """`verify`'s report and the state its replay folded, from one read snapshot (the fold is compared with
    the state index, which a commit between two reads would move). The state is None unless the chain,
    the fold and the indexes hold. Each finding is added in the order the checks run; the append-only
    guards last, whatever broke before them."""
    with store.read_snapshot():
        report, state = _checks(store, workers if target is not None else 1, target or "")
        if guards := store.guard_problems():  # the fence around the log, not the log
            why = f"append-only guard: {'; '.join(guards)} (the database was changed outside lifecycle)"
            copyable = not any(p["code"] == "chain" for p in report["problems"])  # migrate refuses a broken chain
            advice = "`lifecycle migrate` it to a new ledger" if copyable else None
            add_problem(report, problem("append_only_guard", None, why, advice=advice))
    return report, state


def _checks(store: EventStore, workers: int, target: str) -> tuple[JSON, LedgerState | None]:
    """The chain, the replay, the history, the indexes, then the checkpoints in position order, up to the
    first that leaves nothing sound to compare."""
    index_at, index_rows = store.state_index()
    chain, checkpoints, folded = _walk(store, workers, target, min(index_at, store.head().seq))
    report: JSON = {
        "ok": chain.ok,
        "events": chain.events,
        "head": {"seq": chain.head.seq, "hash": chain.head.hash},
        "problems": [],
        "checkpoints": None,  # not checked: a snapshot is compared with a replay of the rows
    }
    if not chain.ok:
        return add_problem(report, problem("chain", chain.bad_seq, str(chain.reason))), None
    if not isinstance(folded, tuple):
        assert folded is not None
        report["details"] = folded.details
        return add_problem(report, problem("replay", folded.seq, str(folded))), None
    report["checkpoints"] = checkpoints
    if (lost := store.history_problem()) is not None:  # a sound chain, but not all of this ledger's
        return add_problem(report, problem("history", None, lost)), None
    at_index, full = folded
    checkpointed = max((c["position"] for c in checkpoints if c["status"] == "ok"), default=0)
    index_problem = _index_problem(index_at, index_rows, at_index, chain.head.seq, checkpointed)
    add_problem(report, index_problem)
    if events_problems := store.index_problems():  # a wrong row would be a wrong answer to a filter
        why = f"event index differs from the log: {'; '.join(events_problems)}"
        add_problem(report, problem("event_index", None, why, advice=REBUILD))
    broken = [c for c in checkpoints if c["status"] == "broken"]  # by position; one with none (null) last
    for c in sorted(broken, key=lambda c: (c["position"] is None, c["position"] or 0)):
        add_problem(report, problem("checkpoint", c["position"], f"checkpoint {c['checkpoint_id']}: {c['reason']}"))
    return report, full if index_problem is None and not events_problems else None


def _walk(
    store: EventStore, workers: int, target: str, index_at: int
) -> tuple[ChainReport, list[JSON], tuple[LedgerState, LedgerState] | CorruptionError | None]:
    """One fold of the whole log as the chain walk checks it, each sound checkpoint compared on its way:
    the checkpoints' reports and the states at `index_at` and at the head, or the replay's corruption
    (None: a broken chain the workers did not fold past)."""
    reports, sound = _checkpoint_statuses(store)
    stops = sorted({index_at, *(r.position for r in sound)})
    if workers > 1:
        chain, states = walk_shared(store, workers, target, stops)
    else:
        chain, states = _walk_here(store, stops)
    if not isinstance(states, list):
        return chain, [], states
    at = dict(zip(stops, states, strict=False))
    for record in sound:
        _compare(store, reports[record.checkpoint_id], record, at[record.position])
    return chain, list(reports.values()), (at[index_at], states[-1])


def _walk_here(store: EventStore, stops: list[int]) -> tuple[ChainReport, Folded]:
    """The state at each of `stops` (ascending), then at the head, folded in this process."""
    walk = ChainWalk(store.select_rows(), times=True)
    states: list[LedgerState] = []
    try:
        for stop in [*stops, None]:  # at the head, every transition must be legal
            states.append(fold_rows(store, states[-1] if states else EMPTY, batches=walk.fold_batches(to=stop)))
    except CorruptionError as e:
        walk.finish()  # a break further on is still the finding
        return walk.report(count=store.count_events, head=store.head), e
    return walk.report(count=store.count_events, head=store.head), states


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
    import multiprocessing  # for this case only
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

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
