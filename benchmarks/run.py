"""Benchmarks: append, replay and checkpoint cost against raw SQLite, raw psycopg and eventsourcing.

    python benchmarks/run.py [--quick] [--json FILE] [--rounds N] [--only SECTION ...] [--profile]

Everything is measured side by side in one run, on one machine and one file system,
with WAL and both `synchronous=NORMAL` and `FULL` where durability matters. Figures are
medians of interleaved rounds with their spread [min..max]; targets are ratios taken in
the same run. See benchmarks/README.md for what each line measures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the sibling modules, when run from elsewhere
    sys.path.insert(0, str(HERE))

import bench_append  # noqa: E402
import bench_log  # noqa: E402
import bench_mix  # noqa: E402
import bench_postgres  # noqa: E402
import bench_replay  # noqa: E402
import bench_startup  # noqa: E402
import bench_writers  # noqa: E402
from bench_common import Row, machine_line  # noqa: E402

SECTIONS = {
    "startup": bench_startup.run,
    "mix": bench_mix.run,
    "append": bench_append.run,
    "replay": bench_replay.run,
    "writers": bench_writers.run,
    "postgres": bench_postgres.run,
    "log": bench_log.run,
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100k-event ledger instead of 1M, fewer ops per round")
    p.add_argument("--json", dest="json_path", type=Path, help="where to write results (default: results/<date>.json)")
    p.add_argument("--rounds", type=int, help="interleaved rounds per figure (default 5; 7 without --quick)")
    p.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections")
    p.add_argument("--workdir", type=Path, help="folder for the ledger files (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the ledger files after the run")
    p.add_argument("--profile", action="store_true", help="also cProfile each hot path and print where time goes")
    args = p.parse_args(argv)
    if args.rounds is not None and args.rounds < 5:
        p.error("--rounds must be at least 5 (medians of >= 5 interleaved rounds)")
    return args


def _table(rows: list[Row]) -> str:
    header = ("section", "measure", "target", "measured: median [min..max]", "ratio", "met")
    lines = [
        (
            r.section, r.name, r.target, r.measured, "" if r.ratio is None else f"{r.ratio:.2f}",
            "-" if r.met is None else ("yes" if r.met else "NO"),
        )
        for r in rows
    ]  # fmt: skip
    widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header))]
    out = []
    for i, line in enumerate([header, *lines]):
        out.append("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rounds = args.rounds or (5 if args.quick else 7)
    sections = args.only or list(SECTIONS)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lifecycle-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    machine = machine_line(workdir)
    settings = {
        "quick": args.quick,
        "rounds": rounds,
        "journal_mode": "WAL",
        "synchronous": ["NORMAL", "FULL"],
        "workdir": str(workdir),
        "sections": sections,
    }
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)
    print(f"settings: {settings}", flush=True)
    rows: list[Row] = []
    details: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for name in sections:
            t0 = time.perf_counter()
            print(f"[{name}]", flush=True)
            section_rows, details[name] = SECTIONS[name](workdir, rounds, args.quick)
            rows += section_rows
            details[name]["elapsed_s"] = round(time.perf_counter() - t0, 1)
        if args.profile:
            from profiles import breakdown, print_breakdown, print_profiles, profile_all

            details["breakdown"] = breakdown(workdir, workdir / "big.db")
            details["profiles"] = profile_all(workdir, workdir / "big.db")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = round(time.perf_counter() - started, 1)
    print()
    print(_table(rows))
    if args.profile:
        print_breakdown(details["breakdown"])
        print_profiles(details["profiles"])
    met = [r.met for r in rows if r.met is not None]
    print(f"\n{sum(met)}/{len(met)} targets met; {elapsed} s; figures are noisy on a shared machine: compare ratios.")
    path = args.json_path or HERE / "results" / f"{dt.date.today().isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine,
        "settings": settings,
        "elapsed_s": elapsed,
        "results": [r.__dict__ for r in rows],
        "details": details,
    }
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
