"""Benchmarks: lifecycle-fsm against a raw baseline doing the same work, and against eventsourcing.

    python benchmarks/run.py [--quick] [--only SUITE ...] [--rounds N] [--json FILE]

Every row is a ratio measured in one run, in interleaved rounds, with its spread;
benchmarks/README.md says what each row measures and which clock it reads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import bench_append
import bench_replay
import bench_startup
import bench_writers
from bench_common import Row, Settings, Workspace, drop_schemas, postgres_problem

HERE = Path(__file__).resolve().parent
PG_URL = os.environ.get("LIFECYCLE_BENCH_PG") or os.environ.get(
    "LIFECYCLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"
)


def _postgres(s: Settings) -> list[Row]:
    import bench_postgres  # psycopg is imported only when PostgreSQL is measured

    return bench_postgres.run(s)


SUITES: dict[str, Callable[[Settings], list[Row]]] = {
    "append": bench_append.run,
    "replay": bench_replay.run,
    "writers": bench_writers.run,
    "postgres": _postgres,
    "startup": bench_startup.run,
}
HEADER = ["id", "measure", "clock", "ratio: median [min..max]", "target", "met", "figures"]


def table(rows: list[Row]) -> str:
    """A Markdown table, as docs/performance.md shows it."""
    lines = [HEADER, ["---"] * len(HEADER), *(row.cells() for row in rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def machine() -> dict[str, object]:
    try:
        from importlib.metadata import version

        peer = version("eventsourcing")
    except Exception:  # not installed: its rows say so
        peer = None
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "eventsourcing": peer,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a quarter of the work per round, 5 rounds")
    p.add_argument("--smoke", action="store_true", help="a tiny run that only proves every suite runs (no figures)")
    p.add_argument("--only", nargs="+", choices=list(SUITES), metavar="SUITE", help=f"among {', '.join(SUITES)}")
    p.add_argument("--rounds", type=int, help="measured rounds per row, after one warm-up (default 7; --quick 5)")
    p.add_argument("--json", type=Path, help="where to write the results (default: results/latest.json)")
    args = p.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    suites = args.only or list(SUITES)
    rounds = args.rounds or (1 if args.smoke else 5 if args.quick else 7)
    scale = 0.01 if args.smoke else 0.25 if args.quick else 1.0
    workdir = Path(tempfile.mkdtemp(prefix="lifecycle-bench-"))
    if {"postgres", "writers"} & set(suites):
        problem = postgres_problem(PG_URL)
        if problem:
            print(f"error: {problem} (set LIFECYCLE_BENCH_PG, or leave out --only postgres writers)", file=sys.stderr)
            return 2
    info = machine()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    rows: list[Row] = []
    elapsed: dict[str, float] = {}
    started = time.perf_counter()
    try:
        ws = Workspace(workdir / "ws", 100 if scale < 1 else 200)  # the files every suite's commands read
        s = Settings(rounds=rounds, warmup=0 if args.smoke else 1, scale=scale, workdir=workdir, pg_url=PG_URL, ws=ws)
        for name in suites:
            t0 = time.perf_counter()
            print(f"[{name}]", flush=True)
            rows += SUITES[name](s)
            elapsed[name] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if {"postgres", "writers"} & set(suites):
            drop_schemas()
    total = round(time.perf_counter() - started, 1)
    text = table(rows)
    met = [row.met for row in rows if row.met is not None]
    print(f"\n{text}\n\n{sum(met)} of {len(met)} targets met; {total} s ({rounds} rounds, scale {scale})")
    doc = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "settings": {"rounds": rounds, "warmup": s.warmup, "scale": scale, "suites": suites},
        "elapsed_s": {**elapsed, "total": total},
        "rows": [row.as_json() for row in rows],
    }
    path = args.json or HERE / "results" / "latest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    path.with_suffix(".md").write_text(text + "\n")
    print(f"results written to {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
