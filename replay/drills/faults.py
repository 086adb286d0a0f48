"""Real damage to a ledger's rows (behind the store's back) and to artifact files; killed writers are in
`writers.py`. A fault returns what it did and every broken promise as `(key, expected, actual)`."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.checkpoints import LoadResult, load_state, snapshot_json
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store.base import EventStore, event_at, verify_chain
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.open import is_postgres_url

Problem = tuple[str, Any, Any]


@attrs.frozen
class FaultOutcome:
    """What a fault did, and how the ledger's promise about it failed (if it did)."""

    detail: JSON
    problems: tuple[Problem, ...] = ()


class _Refused(Exception):
    """The append-only trigger refused a raw edit (either backend's driver error)."""


@contextmanager
def _behind_the_store(db: Path | str) -> Iterator[Callable[..., None]]:
    """Run raw statements (`?` placeholders) with the driver alone, in one committed transaction."""
    if not is_postgres_url(db):
        with closing(sqlite3.connect(db)) as conn, conn:

            def run_sqlite(sql: str, params: tuple[Any, ...] = ()) -> None:
                try:
                    conn.execute(sql, params)
                except sqlite3.DatabaseError as e:
                    raise _Refused(str(e)) from e

            yield run_sqlite
        return
    import psycopg

    with psycopg.connect(str(db)) as pg, pg.transaction():

        def run_pg(sql: str, params: tuple[Any, ...] = ()) -> None:
            try:
                with pg.transaction():  # a savepoint: a refusal leaves the rest usable
                    pg.execute(sql.replace("?", "%s"), params)
            except psycopg.errors.RestrictViolation as e:
                raise _Refused(str(e)) from e

        yield run_pg


def load_both_ways(store: EventStore, to: int | None = None) -> tuple[LoadResult, list[JSON], bool]:
    """Load from the latest usable checkpoint: the result, the checkpoints it skipped, and whether it
    equals a full replay of the log."""
    loaded = load_state(store, to=to)
    full = load_state(store, to=to, use_checkpoints=False)
    skipped = [{"checkpoint_id": cid, "reason": why} for cid, why in loaded.skipped]
    return loaded, skipped, snapshot_json(loaded.state) == snapshot_json(full.state)


def integrity(store: EventStore) -> list[Problem]:
    """The chain re-hashes and a full replay folds every event."""
    problems: list[Problem] = []
    chain = verify_chain(store)
    if not chain.ok:
        problems.append(("chain_valid", True, f"broken at seq {chain.bad_seq}: {chain.reason}"))
    try:
        load_state(store, use_checkpoints=False)
    except CorruptionError as e:
        problems.append(("replay", "a full replay", str(e)))
    return problems


def corrupt_checkpoint(store: EventStore, db: Path | str) -> FaultOutcome:
    """Garble the latest checkpoint's snapshot (a torn write): the next load skips it and says why."""
    latest = next(store.select_checkpoints(), None)
    if latest is None:
        return FaultOutcome({}, (("checkpoint", "a checkpoint to corrupt", "none taken"),))
    with _behind_the_store(db) as run:
        run(
            "UPDATE checkpoints SET snapshot = ? WHERE checkpoint_id = ?",
            (latest.snapshot[: len(latest.snapshot) // 2], latest.checkpoint_id),
        )
    loaded, skipped, same = load_both_ways(store)
    detail = {"checkpoint_id": latest.checkpoint_id, "position": latest.position, "skipped": skipped}
    detail["loaded_from"] = None if loaded.checkpoint is None else loaded.checkpoint.position
    problems: list[Problem] = []
    if latest.checkpoint_id not in (ids := sorted(cid for cid, _ in loaded.skipped)):
        problems.append(("skipped", f"checkpoint {latest.checkpoint_id} skipped", ids))
    if not same:
        problems.append(("replay", "equal to a full replay", "differs"))
    return FaultOutcome(detail, tuple(problems))


def tamper_event(store: EventStore, db: Path | str, *, seq: int | None, rng: random.Random) -> FaultOutcome:
    """Edit one stored event's payload behind the triggers: verify must name that seq."""
    count = store.count_events()
    target = seq if seq is not None else rng.randint(1, max(count, 1))
    event = event_at(store, target)
    if event is None:
        return FaultOutcome({"seq": target}, (("seq", "an event at that seq", f"{count} events"),))
    payload = orjson.loads(event.payload)
    payload["edited"] = "by drill"
    problems: list[Problem] = []
    postgres = is_postgres_url(db)
    with _behind_the_store(db) as run:
        try:
            run("UPDATE events SET actor = actor WHERE seq = ?", (target,))
            problems.append(("trigger", "UPDATE refused", "UPDATE allowed"))
        except _Refused:
            pass  # the trigger held: a tamperer must drop it first
        run("ALTER TABLE events DISABLE TRIGGER USER" if postgres else "DROP TRIGGER IF EXISTS events_refuse_update")
        run("UPDATE events SET payload = ? WHERE seq = ?", (canonical_json(payload), target))
        if postgres:
            run("ALTER TABLE events ENABLE TRIGGER USER")
    report = verify(store)
    if report["ok"] or report.get("bad_seq") != target:
        problems.append(("bad_seq", target, report.get("bad_seq")))
    detail = {"seq": target, "type": event.type, "verify_ok": report["ok"]}
    detail |= {"bad_seq": report.get("bad_seq"), "reason": report.get("reason")}
    return FaultOutcome(detail, tuple(problems))


def tamper_artifact(file: Path, *, rng: random.Random, shown: str, had: set[str]) -> FaultOutcome:
    """Flip one byte (chosen by the seed) of an artifact's file into bytes it never had (`had`: the sha256
    of each of its states; re-flipping a restored file's byte would write earlier tampered bytes back)."""
    data = bytearray(file.read_bytes())
    had.add(hashlib.sha256(data).hexdigest())
    start = rng.randrange(len(data))
    for mask in (0xFF, *range(1, 0xFF)):
        for step in range(len(data)):
            offset = (start + step) % len(data)
            data[offset] ^= mask
            digest = hashlib.sha256(data).hexdigest()
            if digest not in had:
                had.add(digest)
                file.write_bytes(bytes(data))
                return FaultOutcome({"file": shown, "offset": offset})
            data[offset] ^= mask
    return FaultOutcome({"file": shown}, (("tampered", "bytes the file never had", "every one-byte change was tried"),))
