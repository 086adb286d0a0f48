"""Before / after: the same measurements on two source trees, interleaved in one run.

    python benchmarks/ab.py --before DIR --after DIR [--rounds N] [--events N] [--json FILE]

On a busy shared machine absolute figures drift by 2-4x within minutes, so comparing
two separate `run.py` runs says little. Here each round runs every measurement once
with `PYTHONPATH=<before>` and once with `PYTHONPATH=<after>` (order alternating), in
fresh processes, so both trees see the same load; we report the median of the
per-round ratios after / before (for a rate, > 1 is faster; for a time, < 1 is faster).
Every figure is CPU time (user + system of the child processes, `process_time` inside
them), not wall time: on a machine whose load average is several times its core count,
wall time is mostly waiting for a core.

Measurements (each a fresh process of the same interpreter):
- `startup`: `python -m lifecycle_fsm --db F status ID` (each tree's own entry), 5 runs, whole process;
- `verify_cli`: `lifecycle --db F --json verify` on an N-event ledger (chain, checkpoints,
  every transition), events/s;
- `verify_chain`: `store.verify_chain()` in process on the same ledger, events/s;
- `mix`: the command mix of `bench_mix.py` (NORMAL), µs per command, and per type.
The floor `python -c "import sqlite3"` is timed in each round too (start-up ratio).
Children cache bytecode under the temporary folder (`PYTHONPYCACHEPREFIX`, without
`PYTHONDONTWRITEBYTECODE`), as an installed CLI has its `.pyc` (bench_startup.py says why).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_common import median  # noqa: E402

CHILD_VERIFY = """
import sys, time
from lifecycle_fsm.store.sqlite import SQLiteEventStore
s = SQLiteEventStore(sys.argv[1], synchronous="NORMAL")
t = time.process_time(); r = s.verify_chain(); d = time.process_time() - t
assert r.ok
print(r.events / d)
"""

CHILD_MIX = """
import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import time
import bench_mix
bench_mix.clock = time.process_time  # CPU seconds: what the command costs, not the wait for a core
with tempfile.TemporaryDirectory() as tmp:
    b = bench_mix._Mix(Path(tmp), "NORMAL", 20, 1)
    b.ours()  # warm-up
    b.by_type.clear()
    per = [b.ours() for _ in range(3)]
    b.close()
print(json.dumps({"mean": sorted(per)[1], **{k: sorted(v)[1] for k, v in b.by_type.items()}}))
"""


_PYCACHE: list[str] = []  # the bytecode folder of this run (set in `main`)


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": _PYCACHE[0]}


def _run(argv: list[str], tree: Path) -> subprocess.CompletedProcess[str]:
    # cwd=tree: `python -c` puts the working directory first on sys.path
    done = subprocess.run(argv, env=_env(tree), cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} (PYTHONPATH={tree}) exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], tree: Path, runs: int) -> float:
    """CPU seconds (user + system) of one whole process, averaged over `runs`."""
    t0 = _children_cpu()
    for _ in range(runs):
        _run(argv, tree)
    return (_children_cpu() - t0) / runs


def _ledger(tree: Path, folder: Path, events: int) -> tuple[Path, Path]:
    """An `events`-event ledger (realistic streams) and a small one with one candidate."""
    big = folder / "big.db"
    code = (
        "import sys; sys.path.insert(0, sys.argv[3]); from pathlib import Path; "
        "from bench_common import Streams, extend_ledger; from store.sqlite import SQLiteEventStore; "
        "s = SQLiteEventStore(Path(sys.argv[1]), synchronous='NORMAL'); "
        "extend_ledger(s, Streams(), [f'grpo-v7-c{i:04d}' for i in range(500)], int(sys.argv[2])); s.close()"
    )
    _run([sys.executable, "-c", code, str(big), str(events), str(tree / "benchmarks")], tree)
    return big, big


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="source tree of the old code")
    p.add_argument("--after", type=Path, required=True, help="source tree of the new code")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--json", dest="json_path", type=Path)
    args = p.parse_args(argv)
    # `python -m lifecycle_fsm`, not the installed script: the script names an entry point
    # of the tree it was installed from, which the other tree may not have.
    cli = [sys.executable, "-m", "lifecycle_fsm"]
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory(prefix="lifecycle-ab-") as tmp:
        _PYCACHE[:] = [str(Path(tmp) / "pycache")]
        big, _ = _ledger(trees["before"], Path(tmp), args.events)
        probe = "grpo-v7-c0007"
        for tree in trees.values():  # write each tree's bytecode before the first timed round
            _run([*cli, "--db", str(big), "status", probe], tree)
        figures: dict[str, dict[str, list[Any]]] = {name: {} for name in trees}
        floor: list[float] = []
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            floor.append(_timed([sys.executable, "-c", "import sqlite3"], trees["before"], 5))
            for name in order:
                tree = trees[name]
                f = figures[name]
                f.setdefault("startup_s", []).append(_timed([*cli, "--db", str(big), "status", probe], tree, 5))
                cpu = _timed([*cli, "--db", str(big), "--json", "verify"], tree, 1)
                f.setdefault("verify_cli_ev_s", []).append(args.events / cpu)
                rate = float(_run([sys.executable, "-c", CHILD_VERIFY, str(big)], tree).stdout)
                f.setdefault("verify_chain_ev_s", []).append(rate)
                mix = json.loads(_run([sys.executable, "-c", CHILD_MIX, str(tree / "benchmarks")], tree).stdout)
                for key, value in mix.items():
                    f.setdefault(f"mix_{key}_s", []).append(value)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    out: dict[str, Any] = {"events": args.events, "rounds": args.rounds, "floor_s": floor, "figures": figures}
    print(f"\n{'measure':28} {'before (median)':>16} {'after (median)':>16} {'after/before':>13}")
    for key in figures["after"]:
        before, after = figures["before"][key], figures["after"][key]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        out.setdefault("ratios", {})[key] = ratios
        scale = 1e3 if key.endswith("_s") and not key.endswith("ev_s") else 1e-3
        unit = "ms" if scale == 1e3 else "k/s"
        print(f"{key:28} {median(before) * scale:13.1f} {unit:>2} {median(after) * scale:13.1f} {unit:>2} "
              f"{median(ratios):8.2f} [{min(ratios):.2f}..{max(ratios):.2f}]")  # fmt: skip
    for name in trees:
        ratio = [s / fl for s, fl in zip(figures[name]["startup_s"], floor, strict=True)]
        out.setdefault("startup_over_floor", {})[name] = ratio
        print(f"startup / floor, {name}: {median(ratio):.2f} [{min(ratio):.2f}..{max(ratio):.2f}]")
    if args.json_path:
        args.json_path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
