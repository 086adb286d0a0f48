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

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.findings import add_problem, problem
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.checkpoints import checkpoint_problem
from lifecycle_fsm.replay.fold import EMPTY, LedgerState, fold_rows, index_of, snapshot_json
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import ChainWalk, canonical_json, snapshot_digest
from lifecycle_fsm.store.records import ChainReport, CheckpointRecord, StreamHead

__all__ = ["verify", "verify_with_state"]


def _checkpoint_statuses(store: EventStore) -> tuple[dict[int, JSON], list[CheckpointRecord]]:
    """Each checkpoint's status on its own, and the structurally sound ones, which `_compare` then
    holds against the replay at their positions."""
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
    return reports, sound


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
    corrupt = [s.stream_id for s in snaps if not isinstance(s.state, str) or s.state_sha256 != snapshot_digest(s.state)]
    if corrupt:
        return f"stream copy does not match its sha256 (corrupt): {', '.join(sorted(corrupt)[:5])}"
    copies = {snap.stream_id: snap.state for snap in snaps}
    if copies != expected:
        differing = sorted(k for k in expected.keys() | copies.keys() if expected.get(k) != copies.get(k))
        return f"stream copies differ from a full replay: {', '.join(differing[:5])}"
    return None


def _index_problem(
    position: int, stored: list[StreamHead], at_index: LedgerState, head: int, checkpointed: int
) -> JSON | None:
    """The state index (`streams`) must equal, row for row, what a replay to the position it
    reflects implies. Every checkpoint brings it to its own position, so it can be behind the
    head, but never behind the latest sound checkpoint (`checkpointed`): rows were removed.

    Commands find the candidates to invalidate through it, so a missing or edited row is a
    wrong decision waiting to happen; `replay --full` rebuilds it.
    """
    advice = "rebuild it with `lifecycle replay --full`"
    if not checkpointed <= position <= head:
        where = f"past the log's head {head}" if position > head else f"behind the checkpoint at {checkpointed}"
        reason = f"state index (streams) reflects position {position}, {where} (rows were removed or edited)"
        return problem("state_index", None, reason, advice=advice)
    expected = {h.stream_id: h for h in index_of(at_index)}
    rows = {h.stream_id: h for h in stored}
    if rows == expected:
        return None
    differing = sorted(k for k in expected.keys() | rows.keys() if expected.get(k) != rows.get(k))
    first = differing[0]
    reason = (
        f"state index (streams) differs from a replay to its position {position} at {', '.join(differing[:5])}: "
        f"{first} is {_row(rows.get(first))} in the index, {_row(expected.get(first))} in the log"
    )
    return problem("state_index", None, reason, advice=advice)


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
    its legality), the state index, the event index, the checkpoints in position order, then the
    append-only guards, whatever broke before them. The replayed state is returned only when the
    chain, the replay and the indexes hold."""
    report, state = _checks(store, workers, target)
    if guards := store.guard_problems():  # the fence around the log, not the log
        why = f"append-only guard: {'; '.join(guards)} (the database was changed outside lifecycle)"
        copyable = not any(p["code"] == "chain" for p in report["problems"])  # migrate refuses a broken chain
        advice = "`lifecycle migrate` it to a new ledger" if copyable else None
        add_problem(report, problem("append_only_guard", None, why, advice=advice))
    return report, state


def _checks(store: EventStore, workers: int, target: str) -> tuple[JSON, LedgerState | None]:
    """The log's own checks, up to the first that leaves nothing sound to compare."""
    index_at, index_rows = store.state_index()
    chain, checkpoints, full, at_index, corrupt = _walk(store, workers, target, min(index_at, store.head().seq))
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
    assert at_index is not None
    checkpointed = max((c["position"] for c in checkpoints if c["status"] == "ok"), default=0)
    index_problem = _index_problem(index_at, index_rows, at_index, chain.head.seq, checkpointed)
    indexes_hold = _add_index_findings(store, report, index_problem)
    broken = [c for c in checkpoints if c["status"] == "broken"]  # by position; one with none (null) last
    for c in sorted(broken, key=lambda c: (c["position"] is None, c["position"] or 0)):
        add_problem(report, problem("checkpoint", c["position"], f"checkpoint {c['checkpoint_id']}: {c['reason']}"))
    return report, full if indexes_hold else None


def _walk(
    store: EventStore, workers: int, target: str, index_at: int
) -> tuple[ChainReport, list[JSON], LedgerState | None, LedgerState | None, CorruptionError | None]:
    """One fold of the whole log as the chain walk checks it, every sound checkpoint compared on its
    way (a `CorruptionError` anywhere in it is the replay's finding), the state at `index_at` (the
    state index's position) kept; with `workers` > 1, worker processes share the walk and the fold
    (`verify_workers`)."""
    reports, sound = _checkpoint_statuses(store)
    stops = sorted({index_at, *(r.position for r in sound)})
    if workers > 1:
        chain, states, corrupt = _walk_shared(store, workers, target, stops)
    else:
        chain, states, corrupt = _walk_here(store, stops)
    if corrupt is not None or not states:  # a replay error, or a broken chain the workers did not fold past
        return chain, [], None, None, corrupt
    at = dict(zip(stops, states, strict=False))
    for record in sound:
        _compare(store, reports[record.checkpoint_id], record, at[record.position])
    return chain, list(reports.values()), states[-1], at[index_at], None


def _walk_here(store: EventStore, stops: list[int]) -> tuple[ChainReport, list[LedgerState], CorruptionError | None]:
    """The state at each of `stops` (ascending), then at the head, folded in this process."""
    walk = ChainWalk(store.select_rows(), times=True)
    states: list[LedgerState] = []
    corrupt: CorruptionError | None = None
    try:
        state = EMPTY
        for stop in stops:
            state = fold_rows(store, state, batches=walk.fold_batches(to=stop))
            states.append(state)
        states.append(fold_rows(store, state, batches=walk.fold_batches()))  # every transition must be legal
    except CorruptionError as e:
        corrupt = e
        walk.finish()  # a break further on is still the finding
    return walk.report(count=store.count_events, head=store.head), states, corrupt


def _walk_shared(
    store: EventStore, workers: int, target: str, stops: list[int]
) -> tuple[ChainReport, list[LedgerState], CorruptionError | None]:
    """`_walk_here` by worker processes, each over a slice of the chain and a share of the streams; the
    rows up to the head read here, so the workers and this process judge the same log."""
    from lifecycle_fsm.replay.verify_workers import Shares  # multiprocessing, for this case only

    shares = Shares(target, store.head().seq, workers, store.streams(), stops)
    try:
        chain, folded = shares.results(count=store.count_events, head=store.head)
    except BaseException:
        shares.cancel()
        raise
    return (chain, [], folded) if not isinstance(folded, list) else (chain, folded, None)


def _add_index_findings(store: EventStore, report: JSON, index_problem: JSON | None) -> bool:
    """The derived indexes (state index, event index) against the log; True when both hold."""
    add_problem(report, index_problem)  # no position: the index is not the log
    if events_problems := store.index_problems():  # derived too: a wrong row would be a wrong answer to a filter
        why = f"event index differs from the log: {'; '.join(events_problems)}"
        add_problem(report, problem("event_index", None, why, advice="rebuild it with `lifecycle replay --full`"))
    return index_problem is None and not events_problems
