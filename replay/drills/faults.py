"""Fault injection for drills: real damage to the real ledger file and artifact files.

Each fault happens the way the failure would: a writer process SIGKILLed inside an
append (through `LIFECYCLE_FAULT`, see `store/faults.py`), a checkpoint row garbled
and an event row edited behind the store's back (plain `sqlite3`, or plain psycopg on
a PostgreSQL ledger, never our store), an artifact
byte flipped or its folder removed on disk. Each returns what it did (deterministic,
for the report) and any problem with the consequence the ledger promises, as
`(key, expected, actual)`; no problems means the ledger behaved.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson

import lifecycle_fsm
from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.replay.checkpoints import load_state
from lifecycle_fsm.replay.fold import snapshot_json
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store.base import EventStore, event_at, verify_chain
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.faults import ENV_VAR
from lifecycle_fsm.store.open import is_postgres_url

__all__ = [
    "FaultOutcome",
    "child_env",
    "integrity",
    "corrupt_checkpoint",
    "crash_during_append",
    "delete_artifact",
    "tamper_artifact",
    "tamper_event",
]

Problem = tuple[str, Any, Any]

# Appends `count` fail_stage commands (two events each, one transaction), saying
# before and after each one how far it got, so the drill knows which command the
# kill landed in and which positions were acknowledged.
_CRASH_SNIPPET = """
import sys
from lifecycle_fsm.ledger import Ledger
db, candidate, stage, count, actor = sys.argv[1:6]
ledger = Ledger.open(db, synchronous="NORMAL", actor=actor)
print("opened", flush=True)
for i in range(1, int(count) + 1):
    print("begin", i, flush=True)
    result = ledger.fail_stage(candidate, stage)
    print("done", i, *[e.seq for e in result.events], flush=True)
"""


@attrs.frozen
class FaultOutcome:
    """What a fault did, and how the ledger's promise about it failed (if it did)."""

    detail: dict[str, Any]
    problems: tuple[Problem, ...] = ()


def child_env(fault: str | None) -> dict[str, str]:
    """The child's environment: our packages importable even from a source checkout."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    project = str(Path(lifecycle_fsm.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([project, *filter(None, [os.environ.get("PYTHONPATH")])])
    if fault is not None:
        env[ENV_VAR] = fault
    return env


class _Refused(Exception):
    """The append-only trigger refused a raw edit (either backend's driver error)."""


@contextmanager
def _behind_the_store(db: Path | str) -> Iterator[Callable[..., None]]:
    """Run raw statements on the ledger with the driver alone, in one committed transaction.

    SQL is written with `?` placeholders; a trigger refusing a statement raises `_Refused`.
    """
    if is_postgres_url(db):
        import psycopg

        with psycopg.connect(str(db)) as pg, pg.transaction():

            def run_pg(sql: str, params: tuple[Any, ...] = ()) -> None:
                try:
                    with pg.transaction():  # a savepoint: a refusal leaves the rest usable
                        pg.execute(sql.replace("?", "%s"), params)
                except psycopg.errors.RestrictViolation as e:
                    raise _Refused(str(e)) from e

            yield run_pg
        return
    with closing(sqlite3.connect(db)) as conn, conn:

        def run_sqlite(sql: str, params: tuple[Any, ...] = ()) -> None:
            try:
                conn.execute(sql, params)
            except sqlite3.DatabaseError as e:
                raise _Refused(str(e)) from e

        yield run_sqlite


def crash_during_append(
    store: EventStore, db: Path | str, *, candidate: str, stage: str, commands: int, rng: random.Random, actor: str
) -> FaultOutcome:
    """A writer process SIGKILLed before COMMIT in its K-th command (K from the seed)."""
    planned = rng.randint(1, commands)
    fault = f"kill@before_commit#{planned}"  # the store counts command commits only, not opening
    before = store.count_events()
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_SNIPPET, str(db), candidate, stage, str(commands), actor],
        env=child_env(fault), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    acknowledged: list[int] = []
    in_flight: int | None = None
    for line in proc.stdout.splitlines():
        words = line.split()
        if words[:1] == ["begin"]:
            in_flight = int(words[1])
        elif words[:1] == ["done"]:
            in_flight = None
            acknowledged.extend(int(w) for w in words[2:])
    after = store.count_events()
    detail = {
        "commands": commands, "killed_in_command": planned, "fault": fault, "returncode": proc.returncode,
        "acknowledged_events": len(acknowledged), "events_before": before, "events_after": after,
    }  # fmt: skip
    problems: list[Problem] = []
    if proc.returncode != -signal.SIGKILL:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        problems.append(("returncode", -signal.SIGKILL, f"{proc.returncode} ({tail[0]})"))
    if in_flight != planned:
        problems.append(("killed_in_command", planned, in_flight))
    present = sum(1 for seq in acknowledged if event_at(store, seq) is not None)
    if present != len(acknowledged):
        problems.append(("acknowledged_events_kept", len(acknowledged), present))
    if after != before + len(acknowledged):
        problems.append(("events", before + len(acknowledged), after))
    problems.extend(integrity(store))
    stream = store.read_stream(f"candidate:{candidate}")
    if stream and stream[-1].type == "StageFailed":
        problems.append(("torn_event", "none", f"seq {stream[-1].seq} StageFailed without its RecoveryPlanned"))
    return FaultOutcome(detail, tuple(problems))


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
    loaded = load_state(store)
    full = load_state(store, use_checkpoints=False)
    skipped = {cid: why for cid, why in loaded.skipped}
    detail = {
        "checkpoint_id": latest.checkpoint_id,
        "position": latest.position,
        "skipped": [{"checkpoint_id": cid, "reason": why} for cid, why in loaded.skipped],
        "loaded_from": None if loaded.checkpoint is None else loaded.checkpoint.position,
    }
    problems: list[Problem] = []
    if latest.checkpoint_id not in skipped:
        problems.append(("skipped", f"checkpoint {latest.checkpoint_id} skipped", sorted(skipped)))
    if snapshot_json(loaded.state) != snapshot_json(full.state):
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
    detail = {"seq": target, "type": event.type, "verify_ok": report["ok"], "bad_seq": report.get("bad_seq"),
              "reason": report.get("reason")}  # fmt: skip
    return FaultOutcome(detail, tuple(problems))


def tamper_artifact(file: Path, *, rng: random.Random, shown: str, had: set[str]) -> FaultOutcome:
    """Flip one byte (chosen by the seed) of an artifact's file, into bytes the file never had.

    `had` holds the sha256 of every state the file has had (its original included) and gains the new
    one. Flipping the byte a restored file was first tampered at would write the tampered bytes back
    (a 1-byte file always; a 256-byte one 1 time in 256): a state recorded then would rightly be
    reused, and "tampered" would be a lie. The next offset, then other bit patterns, are tried instead.
    """
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


def delete_artifact(folder: Path, *, shown: str) -> FaultOutcome:
    """Remove an artifact's folder (an adapter or a trusted state) from disk."""
    shutil.rmtree(folder)
    return FaultOutcome({"removed": shown})
