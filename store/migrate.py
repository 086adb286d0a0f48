"""Copying a ledger from one store to another (SQLite ⇄ PostgreSQL ⇄ memory), verifying as it goes.

Each source event is checked against the chain, then appended through the destination's own
transaction, which re-chains it: the copy must come out byte-identical or its batch is rolled back.
Batches commit one by one; a copy stopped by a break keeps them and says which seqs they are.

A destination holding events must be a verified prefix of the source (the copy resumes after it).
Checkpoints are copied too, but one whose snapshot fails its digest. A checkpoint whose head hash is
not the log's at its position (or past its head) refuses the copy before anything is written: a
re-chained copy would erase the only trace of a log rewritten or cut under it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import groupby
from operator import itemgetter

import attrs
import orjson

from lifecycle_fsm.errors import ConflictError, CorruptionError, IntegrityError, StoreError
from lifecycle_fsm.store.base import EventStore, hash_at, verify_chain
from lifecycle_fsm.store.chain import ChainWalk, snapshot_digest
from lifecycle_fsm.store.records import CheckpointRecord, EventFilter, Head, NewEvent, Row, StoredEvent, StreamHead

Progress = Callable[[int, int], None]


@attrs.frozen
class MigrationReport:
    """What a copy did: events and checkpoints copied now, those already there, the head after."""

    copied: int
    already_present: int
    checkpoints: int
    checkpoints_present: int
    skipped_checkpoints: tuple[tuple[int, str], ...]
    head: Head


def migrate(
    src: EventStore,
    dst: EventStore,
    *,
    index: Callable[[EventStore], Iterable[StreamHead]] | None = None,
    check: Callable[[Sequence[Row]], None] | None = None,
    progress: Progress | None = None,
    batch: int = 1000,
) -> MigrationReport:
    """Copy every event and checkpoint of `src` that `dst` lacks.

    `index(dst)` derives the destination's stream index once the events are in (the domain's fold).
    `check(rows)` sees the source's sound rows from the first, before they are copied, and stops the copy
    with `CorruptionError`. `progress(done, total)` is called as events are verified.
    """
    target = src.head()
    _refuse_contradicted_log(src, target.seq)
    start = _resume_point(src, dst, target)
    kept = [start.seq]  # the destination holds every event up to here
    try:
        return _copy(src, dst, start, target, kept, index, check, progress, batch)
    except CorruptionError as e:
        raise IntegrityError(f"{e}; {_copied(start.seq, kept[0])}", seq=e.seq) from e
    except StoreError as e:  # a connection lost, a server gone: the batches committed before it stay
        raise StoreError(f"{e}; {_copied(start.seq, kept[0])}; the same copy again resumes it") from e


def _copy(
    src: EventStore,
    dst: EventStore,
    start: Head,
    target: Head,
    kept: list[int],
    index: Callable[[EventStore], Iterable[StreamHead]] | None,
    check: Callable[[Sequence[Row]], None] | None,
    progress: Progress | None,
    batch: int,
) -> MigrationReport:
    """`migrate` after its resume point; `kept[0]` follows the last seq committed in the destination."""
    walk = ChainWalk(src.select_rows(EventFilter(before=target.seq + 1)))
    pending: list[Row] = []
    last = 0
    for rows in walk.rows():
        if check is not None:
            check(rows)
        for row in rows:
            last = row[0]
            if last > start.seq:
                pending.append(row)
            if len(pending) >= batch:
                _write(dst, pending)
                kept[0], pending = last, []
            if progress is not None:
                progress(last, target.seq)
    if walk.bad_seq is not None:
        raise IntegrityError(
            f"the source's chain is broken at seq {walk.bad_seq}: {walk.reason}; {_copied(start.seq, kept[0])}",
            seq=walk.bad_seq,
        )
    _write(dst, pending)
    kept[0] = max(kept[0], last)
    if last != target.seq:
        raise IntegrityError(
            f"the source ended at seq {last}, not at its head {target.seq}; {_copied(start.seq, kept[0])}", seq=last
        )
    copied, present, skipped = _copy_checkpoints(src, dst, target.seq)
    if index is not None:
        dst.rebuild_stream_index(lambda: index(dst))
    head = dst.head()
    if head != target:  # pragma: no cover - each batch was compared row by row
        raise IntegrityError(f"the copy's head {head} is not the source's {target}", seq=head.seq)
    return MigrationReport(target.seq - start.seq, start.seq, copied, present, tuple(skipped), head)


def _resume_point(src: EventStore, dst: EventStore, target: Head) -> Head:
    """Where the copy starts: genesis for an empty destination, its head when a prefix of the source."""
    head = dst.head()
    if head.seq == 0:
        return head
    if head.seq > target.seq and hash_at(dst, target.seq) == target.hash:
        raise ConflictError(
            f"the destination is ahead of the source: it holds {head.seq} events, the source {target.seq}, and "
            f"the source is a prefix of it; refusing to copy into it (to bring the source up to date, copy the "
            f"other way: `lifecycle migrate DST SRC`)"
        )
    if head.seq > target.seq or hash_at(src, head.seq) != head.hash:
        raise ConflictError(
            f"the destination already holds {head.seq} events that are not a prefix of the source "
            f"(its head hash {head.hash[:12]}… is not the source's at seq {head.seq}); refusing to copy into it"
        )
    report = verify_chain(dst)
    if not report.ok:
        raise IntegrityError(
            f"the destination's chain is broken at seq {report.bad_seq}: {report.reason}", seq=report.bad_seq
        )
    return head


def _copied(start: int, written: int) -> str:
    """What a stopped copy left in the destination: the message must not claim more (or less)."""
    if written == start:
        kept = f" (the destination still holds its first {start} events)" if start else ""
        return f"nothing was copied{kept}"
    return f"copied seq {start + 1} to {written} ({written - start} events, each verified), nothing after seq {written}"


def _write(dst: EventStore, rows: Sequence[Row]) -> None:
    """Append `rows` to `dst` in one transaction; every copy must equal its source row."""
    if not rows:
        return
    with dst.transaction() as tx:
        for _, grouped in groupby(rows, key=itemgetter(1)):  # consecutive rows of one stream: one append
            run = list(grouped)
            new = [NewEvent(r[1], r[4], r[5], orjson.loads(r[6]), r[3], r[7], r[8]) for r in run]
            stored = tx.append(run[0][1], run[0][2] - 1, new, fresh_ids=True, copied=True).events
            for copy, original in zip(stored, run, strict=True):
                if copy != StoredEvent(*original):
                    raise IntegrityError(
                        f"the copy of seq {original[0]} differs from the source (payload not in canonical form?); "
                        "this batch was rolled back",
                        seq=original[0],
                    )


def _refuse_contradicted_log(src: EventStore, upto: int) -> None:
    for record in src.select_checkpoints():
        if type(record.position) is not int:  # a position edited into no seq: a damaged checkpoint, not copied
            continue
        if record.position > upto:
            raise IntegrityError(
                f"checkpoint {record.checkpoint_id} was taken at seq {record.position}, but the log ends at seq "
                f"{upto}: events were removed after it (see `lifecycle verify`); nothing was copied, since a copy "
                "would hold no trace of them",
                seq=upto,
            )
        found = hash_at(src, record.position)
        if record.head_hash != found:
            raise IntegrityError(
                f"checkpoint {record.checkpoint_id} recorded hash {record.head_hash} at seq {record.position}, but the "
                f"log has {found} there: the log was rewritten under it, or the checkpoint edited (see `lifecycle "
                "verify`); nothing was copied, since a copy would hold no trace of it",
                seq=record.position,
            )


def _key(c: CheckpointRecord) -> tuple[object, ...]:
    return (c.position, c.head_hash, c.schema_version, c.fingerprint, c.snapshot_sha256, c.recorded_at)


def _copy_checkpoints(src: EventStore, dst: EventStore, upto: int) -> tuple[int, int, list[tuple[int, str]]]:
    have = {_key(c) for c in dst.select_checkpoints()}
    copied = present = 0
    skipped: list[tuple[int, str]] = []
    for record in reversed(list(src.select_checkpoints(at_or_before=upto))):
        if record.snapshot_sha256 != snapshot_digest(record.snapshot):
            skipped.append((record.checkpoint_id, "its snapshot does not match its sha256"))
        elif _key(record) in have:
            present += 1
        else:
            copies = [(s.stream_id, s.version, s.state) for s in src.stream_snapshots(record.checkpoint_id)]
            dst.append_checkpoint(
                position=record.position,
                schema_version=record.schema_version,
                fingerprint=record.fingerprint,
                snapshot=record.snapshot,
                recorded_at=record.recorded_at,
                streams=copies,
            )
            copied += 1
    return copied, present, skipped
