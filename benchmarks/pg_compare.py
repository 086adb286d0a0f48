"""The PostgreSQL single-append and writers rows alone, for before/after comparisons of the store.

Run it from a checkout (`python benchmarks/pg_compare.py single|writers`); to measure
an older store, run the same file with `PYTHONPATH=<older checkout>` so its `store/`
and `lifecycle_fsm/` are imported instead (benchmarks/README.md, "PostgreSQL").
"""

from __future__ import annotations

import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import bench_postgres
from bench_writers import writers_bench

import store


def main(what: str) -> None:
    print("store code from", Path(store.__file__).parent, flush=True)
    try:
        with TemporaryDirectory(prefix="pg-compare-") as tmp:
            for sync in ("NORMAL", "FULL"):
                if what == "single":
                    rows, _ = bench_postgres.single(sync, 5, 300, Path(tmp))
                else:
                    url = bench_postgres.fresh_schema("writers")[1]
                    rows, _ = writers_bench(Path(tmp), sync, 3, 50, target=url, label="-pg", writers=8)
                for row in rows:
                    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
                    print(f"{sync:6s} {row.name:60s} {ratio:>6s}  {row.measured}", flush=True)
    finally:
        bench_postgres.drop_schemas()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "single")
