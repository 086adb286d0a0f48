"""Proving the log was not edited: the hash chain, every checkpoint, and replay legality.

`verify` re-hashes every event, checks each checkpoint against the chain and its
own digest, and replays the whole log through the machine's table. A stale
checkpoint (built by other code) is reported but is not a failure: it is simply
not used. A corrupt one is a failure.

The log is read once: the fold takes its rows from the chain walk (`chain.ChainWalk`),
which hands on only rows whose position, link and hash it has just checked. A broken
chain is the finding whatever the fold met first, as when the chain was walked alone.
With worker processes (`verify_workers`) the report is the same, found in shares.
"""

from __future__ import annotations

import hashlib

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.findings import add_problem, problem
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.checkpoints import checkpoint_problem
from lifecycle_fsm.replay.fold import EMPTY, LedgerState, fold_rows, index_of, snapshot_json
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import ChainWalk, canonical_json
from lifecycle_fsm.store.records import ChainReport, CheckpointRecord, StreamHead

__all__ = ["verify", "verify_with_state"]


def _checkpoint_statuses(store: EventStore) -> tuple[dict[int, JSON], list[CheckpointRecord]]:
    """Each checkpoint's status on its own, and the structurally sound ones in position order, which
    `_compare` then holds against the replay at their positions."""
    reports: dict[int, JSON] = {}
    sound = []
    for record in store.select_checkpoints():
        problem = checkpoint_problem(store, record)
        if problem is None:
            sound.append(record)
            status = "ok"
        else:
            status = "stale" if problem.stale else "broken"  # stale: built by other code, not used, not corrupt
        position = record.position if type(record.position) is int else None  # a seq, or none (edited by hand)
        reports[record.checkpoint_id] = {
            "checkpoint_id": record.checkpoint_id,
            "position": position,
            "status": status,
            "reason": None if problem is None else problem.reason,
        }
    return reports, sorted(sound, key=lambda r: r.position)


def _compare(store: EventStore, report: JSON, record: CheckpointRecord, state: LedgerState) -> None:
    """A sound checkpoint against the replay at its position: its snapshot, then its stream copies."""
    if snapshot_json(state) != record.snapshot:
        report.update(status="broken", reason="snapshot differs from a full replay")
    elif (bad := _stream_copy_problem(store, record.checkpoint_id, state)) is not None:
        report.update(status="broken", reason=bad)


def _stream_copy_problem(store: EventStore, checkpoint_id: int, state: LedgerState) -> str | None:
    """A checkpoint's per-stream copies must each equal that stream in the full replay."""
    expected = {stream_of(cid): canonical_json(c.to_dict()) for cid, c in state.candidates.items()}
    snaps = store.stream_snapshots(checkpoint_id)
    # A copy whose digest does not hold is one `status ID` skips as corrupt: broken here too, not "ok".
    corrupt = [s.stream_id for s in snaps if not isinstance(s.state, str) or s.state_sha256 != _sha256(s.state)]
    if corrupt:
        return f"stream copy does not match its sha256 (corrupt): {', '.join(sorted(corrupt)[:5])}"
    copies = {snap.stream_id: snap.state for snap in snaps}
    if copies != expected:
        differing = sorted(k for k in expected.keys() | copies.keys() if expected.get(k) != copies.get(k))
        return f"stream copies differ from a full replay: {', '.join(differing[:5])}"
    return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _index_problem(store: EventStore, state: LedgerState) -> JSON | None:
    """The state index (`streams`) must equal what a full replay implies, row for row.

    Commands find decided candidates through it (an evidence invalidation's fan-out), so
    an edited status is a wrong decision waiting to happen; `replay --full` rebuilds it.
    """
    expected = {h.stream_id: h for h in index_of(state)}
    stored = {h.stream_id: h for h in store.streams()}
    if stored == expected:
        return None
    differing = sorted(k for k in expected.keys() | stored.keys() if expected.get(k) != stored.get(k))
    first = differing[0]
    reason = (
        f"state index (streams) differs from a full replay at {', '.join(differing[:5])}: "
        f"{first} is {_row(stored.get(first))} in the index, {_row(expected.get(first))} in the log"
    )
    return problem("state_index", None, reason, advice="rebuild it with `lifecycle replay --full`")


def _row(head: StreamHead | None) -> str:
    return "missing" if head is None else f"version {head.version} status {head.status} kind {head.category}"


def verify(store: EventStore, *, workers: int = 1, target: str | None = None) -> JSON:
    """The integrity report `lifecycle verify` prints; `ok` is False if anything is broken.

    Read in one snapshot (`store.read_snapshot()`): the fold is compared with the state
    index, which another writer's commit between the two reads would move ahead of it.
    With `workers` > 1 and the ledger's `target` (its file or URL), that many worker
    processes each walk a slice of the chain and fold a share of the streams; this one
    joins the slices and merges the states.
    """
    return verify_with_state(store, workers=workers, target=target)[0]


def verify_with_state(
    store: EventStore, *, workers: int = 1, target: str | None = None
) -> tuple[JSON, LedgerState | None]:
    """`verify`'s report and the state its full replay folded, for a caller that needs both from
    one read (`report`: one fold, not two). The state is None unless the chain, the fold and the
    state index hold: a broken checkpoint or append-only guard leaves the replayed states sound."""
    with store.read_snapshot():
        return _verify(store, workers if target is not None else 1, target or "")


def _verify(store: EventStore, workers: int, target: str) -> tuple[JSON, LedgerState | None]:
    """Every check, each finding added in the order the checks run: the chain, the replay (and
    its legality), the state index, the event index, the checkpoints in position order, the
    append-only guards. The replayed state is returned only when the chain, the replay and the
    indexes hold."""
    chain, checkpoints, full, corrupt = _walk(store, workers, target)
    report: JSON = {
        "ok": chain.ok,
        "events": chain.events,
        "head": {"seq": chain.head.seq, "hash": chain.head.hash},
        "problems": [],
    }
    if not chain.ok:  # checkpoints: null, not checked (a snapshot is compared with a replay of the rows)
        report["checkpoints"] = None
        return add_problem(report, problem("chain", chain.bad_seq, str(chain.reason))), None
    if corrupt is not None or full is None:
        assert corrupt is not None
        report.update(checkpoints=None, details=corrupt.details)
        return add_problem(report, problem("replay", corrupt.seq, str(corrupt))), None
    report["checkpoints"] = checkpoints
    if (lost := store.history_problem()) is not None:  # a sound chain, but not all of this ledger's
        return add_problem(report, problem("history", None, lost)), None
    indexes_hold = _add_index_findings(store, report, full)
    broken = [c for c in checkpoints if c["status"] == "broken"]  # by position; one with none (null) last
    for c in sorted(broken, key=lambda c: (c["position"] is None, c["position"] or 0)):
        add_problem(report, problem("checkpoint", c["position"], f"checkpoint {c['checkpoint_id']}: {c['reason']}"))
    if guards := store.guard_problems():  # the fence around the log, not the log
        why = f"append-only guard: {'; '.join(guards)} (the database was changed outside lifecycle)"
        add_problem(report, problem("append_only_guard", None, why, advice="`lifecycle migrate` it to a new ledger"))
    return report, full if indexes_hold else None


def _walk(
    store: EventStore, workers: int, target: str
) -> tuple[ChainReport, list[JSON], LedgerState | None, CorruptionError | None]:
    """One fold of the whole log as the chain walk checks it, every sound checkpoint compared on its
    way (a `CorruptionError` anywhere in it is the replay's finding); with `workers` > 1, worker
    processes share the walk and the fold (`verify_workers`)."""
    reports, sound = _checkpoint_statuses(store)
    if workers > 1:
        return _walk_shared(store, workers, target, reports, sound)
    walk = ChainWalk(store.select_rows())
    full: LedgerState | None = None
    corrupt: CorruptionError | None = None
    try:
        state = EMPTY
        for record in sound:
            state = fold_rows(store, state, batches=walk.fold_batches(to=record.position))
            _compare(store, reports[record.checkpoint_id], record, state)
        full = fold_rows(store, state, batches=walk.fold_batches())  # the rest: every transition must still be legal
    except CorruptionError as e:
        corrupt = e
        walk.finish()  # a break further on is still the finding
    chain = walk.report(count=store.count_events, head=store.head)
    return chain, ([] if corrupt else list(reports.values())), full, corrupt


def _walk_shared(
    store: EventStore, workers: int, target: str, reports: dict[int, JSON], sound: list[CheckpointRecord]
) -> tuple[ChainReport, list[JSON], LedgerState | None, CorruptionError | None]:
    """`_walk` by worker processes, each over a slice of the chain and a share of the streams; the
    rows up to the head read here, so the workers and this process judge the same log."""
    from lifecycle_fsm.replay.verify_workers import Shares  # multiprocessing, for this case only

    shares = Shares(target, store.head().seq, workers, store.streams(), [r.position for r in sound])
    try:
        chain, folded = shares.results(count=store.count_events, head=store.head)
    except BaseException:
        shares.cancel()
        raise
    if not isinstance(folded, list):
        return chain, [], None, folded
    for record, state in zip(sound, folded, strict=False):
        _compare(store, reports[record.checkpoint_id], record, state)
    return chain, list(reports.values()), folded[-1], None


def _add_index_findings(store: EventStore, report: JSON, full: LedgerState) -> bool:
    """The derived indexes (state index, event index) against the log; True when both hold."""
    index_problem = _index_problem(store, full)  # no position: the index is not the log
    add_problem(report, index_problem)
    if events_problems := store.index_problems():  # derived too: a wrong row would be a wrong answer to a filter
        why = f"event index differs from the log: {'; '.join(events_problems)}"
        add_problem(report, problem("event_index", None, why, advice="rebuild it with `lifecycle replay --full`"))
    return index_problem is None and not events_problems
