"""Proving the log was not edited: the hash chain, every checkpoint, and replay legality.

`verify` re-hashes every event, checks each checkpoint against the chain and its
own digest, and replays the whole log through the machine's table. A stale
checkpoint (built by other code) is reported but is not a failure: it is simply
not used. A corrupt one is a failure.

The log is read once: the fold takes its rows from the chain walk (`chain.ChainWalk`),
which hands on only rows whose position, link and hash it has just checked. A broken
chain is the finding whatever the fold met first, as when the chain was walked alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.replay.checkpoints import checkpoint_problem
from lifecycle_fsm.replay.fold import EMPTY, LedgerState, fold_rows, index_of, snapshot_json
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import ChainWalk, canonical_json
from lifecycle_fsm.store.records import StreamHead

__all__ = ["verify", "verify_with_state"]


def _checkpoint_report(store: EventStore, walk: ChainWalk) -> tuple[list[dict[str, Any]], bool, LedgerState]:
    """Each checkpoint's status; structurally sound ones are compared on the way of one
    replay pass that then goes on to the head, so the whole log is folded once (a
    `CorruptionError` anywhere in it propagates); also returns the state at the head."""
    reports: dict[int, dict[str, Any]] = {}
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
    state = EMPTY
    for record in sorted(sound, key=lambda r: r.position):
        state = fold_rows(store, state, batches=walk.fold_batches(to=record.position))
        if snapshot_json(state) != record.snapshot:
            reports[record.checkpoint_id].update(status="broken", reason="snapshot differs from a full replay")
        elif (bad := _stream_copy_problem(store, record.checkpoint_id, state)) is not None:
            reports[record.checkpoint_id].update(status="broken", reason=bad)
    state = fold_rows(store, state, batches=walk.fold_batches())  # the rest: every transition must still be legal
    ordered = list(reports.values())
    return ordered, all(r["status"] != "broken" for r in ordered), state


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


def _index_problem(store: EventStore, state: LedgerState) -> str | None:
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
    return (
        f"state index (streams) differs from a full replay at {', '.join(differing[:5])}: "
        f"{first} is {_row(stored.get(first))} in the index, {_row(expected.get(first))} in the log "
        "(rebuild it with `lifecycle replay --full`)"
    )


def _row(head: StreamHead | None) -> str:
    return "missing" if head is None else f"version {head.version} status {head.status} kind {head.category}"


def verify(store: EventStore) -> dict[str, Any]:
    """The integrity report `lifecycle verify` prints; `ok` is False if anything is broken.

    Read in one snapshot (`store.read_snapshot()`): the fold is compared with the state
    index, which another writer's commit between the two reads would move ahead of it.
    """
    return verify_with_state(store)[0]


def verify_with_state(store: EventStore) -> tuple[dict[str, Any], LedgerState | None]:
    """`verify`'s report and the state its full replay folded, for a caller that needs both from
    one read (`report`: one fold, not two). The state is None unless the chain, the fold and the
    state index hold: a broken checkpoint or append-only guard leaves the replayed states sound."""
    with store.read_snapshot():
        return _verify(store)


def _verify(store: EventStore) -> tuple[dict[str, Any], LedgerState | None]:
    walk = ChainWalk(store.select_rows())
    full: LedgerState | None = None
    corrupt: CorruptionError | None = None
    try:  # one fold of the whole log as the chain walk checks it, every checkpoint on its way
        checkpoints, checkpoints_ok, full = _checkpoint_report(store, walk)
    except CorruptionError as e:
        corrupt = e
        walk.finish()  # a break further on is still the finding
    chain = walk.report(count=store.count_events, head=store.head)
    report: dict[str, Any] = {
        "ok": chain.ok,
        "events": chain.events,
        "head": {"seq": chain.head.seq, "hash": chain.head.hash},
    }
    if not chain.ok:  # checkpoints: null, not checked (a snapshot is compared with a replay of the rows)
        report.update(checkpoints=None, bad_seq=chain.bad_seq, reason=chain.reason)
        return report, None
    if corrupt is not None or full is None:
        assert corrupt is not None
        report.update(checkpoints=None, ok=False, bad_seq=corrupt.seq, reason=str(corrupt), details=corrupt.details)
        return report, None
    report["checkpoints"] = checkpoints
    if (lost := store.history_problem()) is not None:  # a sound chain, but not all of this ledger's
        report.update(ok=False, bad_seq=None, reason=lost)
        return report, None
    if (index_problem := _index_problem(store, full)) is not None:  # no position: the index is not the log
        report.update(ok=False, bad_seq=None, reason=index_problem)
        return report, None
    if not checkpoints_ok:  # the first bad position: the broken checkpoint's
        broken = [c for c in checkpoints if c["status"] == "broken"]  # one with no position (null) last
        first = min(broken, key=lambda c: (c["position"] is None, c["position"] or 0))
        reason = f"checkpoint {first['checkpoint_id']}: {first['reason']}"
        report.update(ok=False, bad_seq=first["position"], reason=reason)
    elif guards := store.guard_problems():  # the log holds: said last, what is left is the fence around it
        why = f"append-only guard: {'; '.join(guards)} (the database was changed outside lifecycle; "
        report.update(ok=False, bad_seq=None, reason=why + "`lifecycle migrate` it to a new ledger to restore them)")
    return report, full
