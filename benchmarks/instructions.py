"""Instructions per command or per event, counted by callgrind: a before / after that load cannot move.

    python benchmarks/instructions.py TREE [TREE ...] [--what cmd mix rw batch] [--sync NORMAL]

On a machine shared with other work, CPU-time A/B figures of a ~150 µs command swing by
±20% between rounds; `valgrind --tool=callgrind` counts the instructions a process
executes in user space, the same on every run (event ids are random: ±0.5%). Each
workload runs twice per tree, with `n1` and `n2` items, and the figure is
(I(n2) - I(n1)) / (n2 - n1): start-up, imports and warm-up cancel out. What it cannot
see is time in the kernel (system calls, page-cache copies, writeback), so pair it with
a count of system calls (`strace -c`) or a CPU-time A/B (`ab.py`).

Workloads (the library from `PYTHONPATH=TREE`, these benchmark modules from this checkout):
- `cmd`: `Ledger.record_trusted_state` round-robin over 100 candidates (bench_append);
- `mix`: the seven commands of `bench_mix` per new candidate (per command);
- `rw`: `cmd` followed by a `read_stream` of another candidate (per pair);
- `batch`: `store.transaction()` with 10 appends of 100 events (per event).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
what, sync, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
tmp = Path(tempfile.mkdtemp())
if what in ("cmd", "rw"):
    from bench_append import KIND, N_CANDIDATES, cid_of, seed_candidates, tiny_files
    from bench_common import ACTOR
    from lifecycle_fsm.ledger import Ledger
    files = tiny_files(tmp); ids = [cid_of(i) for i in range(N_CANDIDATES)]
    ledger = Ledger.open(tmp / "l.db", synchronous=sync, actor=ACTOR)
    seed_candidates(ledger.store, ids)
    for i in range(200 + n):
        ledger.record_trusted_state(ids[i % N_CANDIDATES], KIND, files[i % N_CANDIDATES])
        if what == "rw":
            ledger.store.read_stream("candidate:" + ids[(i + 37) % N_CANDIDATES])
elif what == "mix":
    import bench_mix
    bench = bench_mix._Mix(tmp, sync, 5 + n, 1)
    for i in range(5 + n):
        for _, run in bench_mix.mix_commands(bench.ledger, bench.ws, i, f"m{i}"):
            run()
elif what == "batch":
    from bench_common import Streams
    from lifecycle_fsm.events import stream_of
    from lifecycle_fsm.store.sqlite import SQLiteEventStore
    store = SQLiteEventStore(tmp / "b.db", synchronous=sync)
    streams = Streams(root=str(tmp))
    for _ in range(1 + n):
        batch = [(f"b{j}", *streams.take(f"b{j}", 100)) for j in range(10)]
        with store.transaction() as tx:
            for cid, expected, events, state in batch:
                tx.append(stream_of(cid), expected, events, status=state, category="grpo")
"""
# (n1, n2, items per n): per command, per command, per pair, per event
PLAN = {"cmd": (0, 500, 1), "mix": (0, 20, 7), "rw": (0, 500, 1), "batch": (0, 3, 1000)}


def count(tree: Path, what: str, sync: str, n: int) -> int:
    """User-space instructions of one run of `what` with `n` items on `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", CHILD,
         str(HERE), what, sync, str(n)],
        env=env, cwd=tree, capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{what} on {tree} failed: {done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs="+", type=Path, help="source trees (the first is the reference)")
    p.add_argument("--what", nargs="+", choices=sorted(PLAN), default=["cmd", "mix", "batch"])
    p.add_argument("--sync", default="NORMAL")
    args = p.parse_args(argv)
    for what in args.what:
        n1, n2, items = PLAN[what]
        first = None
        for tree in args.trees:
            per = count(tree.resolve(), what, args.sync, n2) - count(tree.resolve(), what, args.sync, n1)
            per /= (n2 - n1) * items
            first = first or per
            unit = "event" if what == "batch" else "command"
            print(f"{what:5} {args.sync:6} {tree}: {per / 1e3:8.1f}k instructions per {unit} ({per / first:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
