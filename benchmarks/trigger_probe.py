"""What the replace-refusing trigger costs per inserted row, by how much it probes.

    python benchmarks/trigger_probe.py [--rows N] [--rounds N]

Issue #13 asked whether `events_refuse_replace` (three EXISTS probes: seq, event_id,
(stream_id, version)) should probe once. Each variant inserts the same rows, one
statement each inside one transaction (synchronous=OFF: no fsync, only the insert's
CPU), into an events table of the store's schema already holding 100k rows; CPU µs per
row, median of the rounds, variants interleaved. `when_0` is a trigger that never
probes: the fixed cost of having a BEFORE INSERT trigger at all.
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

from store.sqlite_schema import FILTER_INDEXES, SCHEMA

_T = "CREATE TRIGGER events_refuse_replace BEFORE INSERT ON events WHEN {} BEGIN SELECT RAISE(ABORT, 'x'); END"
VARIANTS = {
    "no_trigger": None,
    "when_0": _T.format("0"),
    "one_probe_seq": _T.format("EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)"),
    "one_probe_event_id": _T.format("EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)"),
    "one_exists_or": _T.format(
        "EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq OR event_id = NEW.event_id "
        "OR (stream_id = NEW.stream_id AND version = NEW.version))"
    ),
    "three_probes_(current)": SCHEMA[3],
}


def _row(i: int) -> tuple[object, ...]:
    return (i, f"cand-{i % 1000}", i // 1000 + 1, str(uuid.uuid4()), "T", 1, "{}" * 100, "t", "a", "0" * 64, "1" * 64)


def one(folder: Path, name: str, base: int, rows: int) -> float:
    path = folder / f"{name}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute(SCHEMA[0])
    for statement in FILTER_INDEXES:
        conn.execute(statement)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?)", [_row(i) for i in range(1, base + 1)])
    conn.execute("COMMIT")
    if VARIANTS[name]:
        conn.execute(VARIANTS[name])
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
    floor = statistics.median(figures["no_trigger"])
    for name in names:
        med = statistics.median(figures[name])
        rounds = [round(x, 1) for x in figures[name]]
        print(f"{name:24} {med:6.1f} µs/row  (+{med - floor:5.1f} over no trigger)  {rounds}")


if __name__ == "__main__":
    main()
