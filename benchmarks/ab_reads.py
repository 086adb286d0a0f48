"""Before / after of the read path (issues #13, #9): two source trees, interleaved, CPU time.

    python benchmarks/ab_reads.py --before DIR --after DIR [--events N] [--rounds N] [--db FILE]

Builds one ledger of N events (default 100,000; the replay section's realistic streams)
unless `--db` names one, then each round starts one child per tree (`PYTHONPATH=<tree>`,
order alternating) that times, `--reps` times each, alternating inside the child:
- `fold`: `load_state(store, use_checkpoints=False)` (the full fold);
- `raw`: the replay section's baseline, a SELECT of the fold's six columns in seq order,
  `fetchmany(256)`, `orjson.loads` of every payload;
- `checked`: the same fold with every row's own hash recomputed (`checked=True`);
- `stream`: `StreamReader(store).existing(ID)` for the long-lived candidate (what
  `status ID` folds; each row checked by `upcasting.check_row`).
We report per tree the median [min..max] of the per-run figures and of the ratios taken
inside one child (fold rate / raw rate, checked / unchecked), so both trees see the same
machine. Figures are `time.process_time`: on a loaded machine wall time is mostly waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LONG_ID = "grpo-v7-c0000"

CHILD = """
import json, sqlite3, sys, time
import orjson
from lifecycle_fsm.streams import StreamReader
from lifecycle_fsm.replay import load_state
from lifecycle_fsm.store.sqlite import SQLiteEventStore

db, reps, long_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def raw():
    conn = sqlite3.connect(db)
    loads = orjson.loads
    cur = conn.execute("SELECT seq, stream_id, version, type, schema_version, payload FROM events ORDER BY seq")
    while rows := cur.fetchmany(256):
        for row in rows:
            loads(row[5])
    conn.close()

def fold(checked=False):
    store = SQLiteEventStore(db, synchronous="NORMAL")
    load_state(store, use_checkpoints=False, checked=checked)
    store.close()

def stream():
    store = SQLiteEventStore(db, synchronous="NORMAL")
    StreamReader(store).existing(long_id)
    store.close()

runs = {"fold": fold, "raw": raw, "checked": lambda: fold(True), "stream": stream}
for f in runs.values():
    f()
out = {k: [] for k in runs}
for _ in range(reps):
    for k, f in runs.items():
        t0 = time.process_time()
        f()
        out[k].append(time.process_time() - t0)
print(json.dumps(out))
"""


def _build(path: Path, events: int) -> None:
    sys.path.insert(0, str(HERE))
    from bench_common import Streams, extend_ledger
    from bench_replay import _ids, _open

    store = _open(path)
    extend_ledger(store, Streams(), _ids(), events)
    store.close()


def _spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=3, help="runs of each measure per child")
    parser.add_argument("--db", type=Path, help="an existing ledger (default: build one of --events events)")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "ledger.db"
            _build(db, args.events)
        figures: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        for r in range(args.rounds):
            for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                env = {**os.environ, "PYTHONPATH": str(trees[name])}
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(db), str(args.reps), LONG_ID],
                    env=env, cwd=trees[name], capture_output=True, text=True, check=True,
                )  # fmt: skip
                out = json.loads(done.stdout)
                got = figures[name]
                for k, v in out.items():
                    got.setdefault(k, []).extend(v)
                got.setdefault("fold_raw", []).extend(r / f for f, r in zip(out["fold"], out["raw"], strict=True))
                got.setdefault("checked_unchecked", []).extend(
                    c / f for f, c in zip(out["fold"], out["checked"], strict=True)
                )
    for name, got in figures.items():
        print(f"{name} ({trees[name]}):")
        print(f"  fold rate / raw rate      {_spread(got['fold_raw'])}")
        print(f"  checked / unchecked fold  {_spread(got['checked_unchecked'])}")
        for k in ("fold", "raw", "checked", "stream"):
            print(f"  {k:8s} ms CPU          {_spread([x * 1e3 for x in got[k]], 2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
