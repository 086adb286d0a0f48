"""What the replace-refusing trigger costs per inserted row, by its form and the table's.

    python benchmarks/trigger_probe.py [--rows N] [--rounds N]

Each variant inserts the same rows, one statement each inside one transaction
(synchronous=OFF: no fsync, only the insert's CPU), into an events table with the
store's filter indexes already holding 100k rows; CPU µs per row, median of the rounds,
variants interleaved.

Store schema 2's table (constraints ABORT, a CHECK) with any trigger at all (`when_0`
never probes) runs every row's INSERT under a statement journal, which copies each page
the row touches; that is the trigger's cost, not its probes. Schema 3's table (every
constraint ON CONFLICT FAIL, no CHECK) with a trigger that raises FAIL needs none.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lifecycle_fsm.store.sqlite_schema import EVENTS_TABLE, FILTER_INDEXES, SCHEMA

_V2_TABLE = """CREATE TABLE events (
    seq INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, version INTEGER NOT NULL CHECK (version >= 1),
    event_id TEXT NOT NULL, type TEXT NOT NULL, schema_version INTEGER NOT NULL, payload TEXT NOT NULL,
    recorded_at TEXT NOT NULL, actor TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
    UNIQUE (stream_id, version), UNIQUE (event_id))"""
_V2_TRIGGER = """CREATE TRIGGER events_refuse_replace BEFORE INSERT ON events
    WHEN EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)
      OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)
      OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)
    BEGIN SELECT RAISE(ABORT, 'events are append-only: REPLACE refused'); END"""
_V3_TABLE = EVENTS_TABLE.format(name="events")
_T = "CREATE TRIGGER events_refuse_replace BEFORE INSERT ON events WHEN {} BEGIN SELECT RAISE({}, 'x'); END"
VARIANTS: dict[str, tuple[str, str | None]] = {
    "schema2_no_trigger": (_V2_TABLE, None),
    "schema2_when_0": (_V2_TABLE, _T.format("0", "ABORT")),
    "schema2_three_probes": (_V2_TABLE, _V2_TRIGGER),
    "schema3_no_trigger": (_V3_TABLE, None),
    "schema3_when_0_abort": (_V3_TABLE, _T.format("0", "ABORT")),
    "schema3_when_0_fail": (_V3_TABLE, _T.format("0", "FAIL")),
    "schema3_(current)": (_V3_TABLE, SCHEMA[3]),
}


def _row(i: int) -> tuple[object, ...]:
    return (i, f"cand-{i % 1000}", i // 1000 + 1, str(uuid.uuid4()), "T", 1, "{}" * 100, "t", "a", "0" * 64, "1" * 64)


def one(folder: Path, name: str, base: int, rows: int) -> float:
    path = folder / f"{name}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    table, trigger = VARIANTS[name]
    conn.execute(table)
    for statement in FILTER_INDEXES:
        conn.execute(statement)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?)", [_row(i) for i in range(1, base + 1)])
    conn.execute("COMMIT")
    if trigger:
        conn.execute(trigger)
    todo = [_row(i) for i in range(base + 1, base + rows + 1)]
    conn.execute("BEGIN")
    t0 = time.process_time()
    for r in todo:
        conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?)", r)
    elapsed = time.process_time() - t0
    conn.execute("COMMIT")
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return elapsed / rows * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=30_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    names = list(VARIANTS)
    figures: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                figures[name].append(one(Path(tmp), name, 100_000, args.rows))
    floor = statistics.median(figures["schema2_no_trigger"])
    for name in names:
        med = statistics.median(figures[name])
        rounds = [round(x, 1) for x in figures[name]]
        print(f"{name:24} {med:6.1f} µs/row  (+{med - floor:5.1f} over schema 2 without trigger)  {rounds}")


if __name__ == "__main__":
    main()
