"""Where one PostgreSQL append's time goes: ours (`store.append`) beside raw INSERT+COMMIT of the same row.

    python benchmarks/pg_probe.py [--sync on|off] [--n 300] [--rounds 7] [--trees DIR ...]

Per contender and round: wall µs per append, this process's CPU µs per append
(`process_time`), the server backend's CPU µs per append (`/proc/<backend pid>/schedstat`:
only when the server runs on this machine and its processes are readable), and per
transaction the WAL bytes (`pg_current_wal_insert_lsn()`), WAL records, full-page images,
WAL writes and WAL syncs (`pg_stat_wal`). The WAL figures are cluster-wide: another
session writing at the same time inflates them (the minimum over rounds is the honest one).

Contenders, each on a fresh schema, interleaved (the order rotates each round):
- `raw`: psycopg's default transaction, `INSERT` of the row (values computed before the
  clock) then `COMMIT` (3 round trips: BEGIN, INSERT, COMMIT), into the store's own table
  (`store.postgres_schema.DDL`: the same columns, CHECKs, PRIMARY KEY, UNIQUEs, filter
  indexes and update/delete-refusing triggers);
- `raw_bare`: the same into a table with only the PRIMARY KEY and the two UNIQUEs;
- `store`: `store.append` of one event, its `NewEvent` built before the clock (the chain
  hash, canonical JSON and everything else the store does is on the clock).
With `--trees A B`, every round runs one child process per tree (order alternating), each
measuring the three contenders itself with that tree's `store/` first on `sys.path`: an
A/B of two store versions at the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TREE = os.environ.get("PG_PROBE_TREE")
sys.path[:0] = [str(HERE), TREE or str(HERE.parent)]

import psycopg  # noqa: E402

METRICS = ("wall", "client", "server", "wal_bytes", "wal_records", "wal_fpi", "wal_write", "wal_sync")


def _server_ns(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except OSError:
        return None


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def _wal(admin: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """The WAL position and `pg_stat_wal` once the backend of `conn` has flushed its pending statistics.

    A backend flushes them when it goes idle, at most once a second: wait past that, send
    it one statement, then read (other sessions' WAL in the same window is counted too:
    cluster-wide figures)."""
    time.sleep(1.1)
    conn.execute("SELECT pg_stat_force_next_flush()")
    if not conn.autocommit:
        conn.rollback()
    time.sleep(0.1)
    row = admin.execute("SELECT pg_current_wal_insert_lsn()::text, wal_records, wal_fpi, wal_write, wal_sync "
                        "FROM pg_stat_wal").fetchone()  # fmt: skip
    assert row is not None
    return tuple(row)


class _Contenders:
    """The three contenders of one process (this tree's store), each on a fresh schema."""

    def __init__(self, sync: str) -> None:
        import bench_postgres
        from bench_common import Clock

        from lifecycle_fsm.events import TrustedStateRecorded
        from lifecycle_fsm.store.open import open_store

        self.bench = bench_postgres
        mode = {"on": "FULL", "off": "NORMAL"}[sync]
        self.admin = psycopg.connect(bench_postgres.BASE, autocommit=True)
        self.store = open_store(bench_postgres.fresh_schema("probe")[1], synchronous=mode)
        self.raws = {
            "raw": bench_postgres.RawPg(bench_postgres.fresh_schema("probe")[1], mode, table="store"),
            "raw_bare": bench_postgres.RawPg(bench_postgres.fresh_schema("probe")[1], mode, table="bare"),
        }
        self.ids = [f"grpo-v7-lr3e-6-c{i:03d}" for i in range(10)]
        path = "/data/runs/2025-06-01T08-30-00_grpo-v7_lr3e-6/{}/stage-sampling/step-000120/trusted-states/queue"
        self.payloads = [
            TrustedStateRecorded("prompt_queue", path.format(c), f"{i:064x}").to_payload()
            for i, c in enumerate(self.ids)
        ]
        self.versions = dict.fromkeys(self.ids, 0)
        self.clock = Clock()
        self.counting = False
        self.results: dict[str, dict[str, list[float]]] = {}

    def store_round(self, k: int) -> None:
        from bench_common import ACTOR

        from lifecycle_fsm.events import TrustedStateRecorded, stream_of
        from lifecycle_fsm.store.records import NewEvent

        events = []
        for i in range(k):
            cid = self.ids[i % 10]
            event = NewEvent(stream_of(cid), TrustedStateRecorded.TYPE, 1, self.payloads[i % 10], uuid.uuid4().hex,
                             self.clock(), ACTOR)  # fmt: skip
            events.append((cid, event))

        def work() -> None:
            for cid, event in events:
                self.store.append(event.stream_id, self.versions[cid], [event], fresh_ids=True)
                self.versions[cid] += 1

        self.measure("store", work, self.store.session.conn, k)

    def raw_round(self, name: str, k: int) -> None:
        from lifecycle_fsm.events import TrustedStateRecorded, stream_of

        raw = self.raws[name]
        ids, payloads = self.ids, self.payloads
        rows = raw.rows([(stream_of(ids[i % 10]), TrustedStateRecorded.TYPE, payloads[i % 10]) for i in range(k)])
        self.measure(name, lambda: raw.one_per_tx(rows), raw.conn, k)

    def measure(self, name: str, work: Any, conn: psycopg.Connection[Any], k: int) -> None:
        d = self.results.setdefault(name, {m: [] for m in METRICS})
        if self.counting:  # WAL and flushes: the backend's pending statistics flushed before and after
            w0 = _wal(self.admin, conn)
            work()
            w1 = _wal(self.admin, conn)
            d["wal_bytes"].append((_lsn(w1[0]) - _lsn(w0[0])) / k)
            for m, a, b in zip(METRICS[4:], w0[1:], w1[1:], strict=True):
                d[m].append((b - a) / k)
            return
        pid = conn.info.backend_pid
        s0, c0, t0 = _server_ns(pid), time.process_time(), time.perf_counter()
        work()
        t1, c1, s1 = time.perf_counter(), time.process_time(), _server_ns(pid)
        d["wall"].append((t1 - t0) / k * 1e6)
        d["client"].append((c1 - c0) / k * 1e6)
        if s0 is not None and s1 is not None:
            d["server"].append((s1 - s0) / k / 1e3)

    def close(self) -> None:
        self.store.close()
        for raw in self.raws.values():
            raw.close()
        self.admin.close()
        self.bench.drop_schemas()


def child(sync: str, n: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Measure the three contenders in this process (this tree's store), interleaved, then count WAL."""
    c = _Contenders(sync)
    runs = [c.store_round, lambda k: c.raw_round("raw", k), lambda k: c.raw_round("raw_bare", k)]
    try:
        for run in runs:
            run(50)  # warm-up: connections, prepared statements, the first pages
        c.results.clear()
        for r in range(rounds):
            j = r % len(runs)
            for run in runs[j:] + runs[:j]:
                run(n)
        c.counting = True
        for run in runs:
            run(n)
    finally:
        c.close()
    import lifecycle_fsm.store as store_package

    c.results["store"]["tree"] = [str(Path(store_package.__file__).parent)]  # type: ignore[list-item]
    return c.results


def _fmt(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.0f} [{min(values):.0f}..{max(values):.0f}]"


def _fmt_ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def report(label: str, res: dict[str, dict[str, list[float]]]) -> None:
    print(f"-- {label}")
    print(f"  {'contender':9s} {'wall us':>18s} {'client cpu us':>16s} {'server cpu us':>16s} "
          f"{'WAL B/tx':>9s} {'records':>7s} {'fpi':>5s} {'writes':>6s} {'syncs':>5s}")  # fmt: skip
    print(f"  store code from {res['store'].get('tree')}")
    for name, d in res.items():
        wal = f"{statistics.median(d['wal_bytes']):9.0f} {statistics.median(d['wal_records']):7.1f} "
        wal += f"{statistics.median(d['wal_fpi']):5.2f} "
        wal += f"{statistics.median(d['wal_write']):6.2f} {statistics.median(d['wal_sync']):5.2f}"
        print(f"  {name:9s} {_fmt(d['wall']):>18s} {_fmt(d['client']):>16s} {_fmt(d['server']):>16s} {wal}")
    for other in ("raw", "raw_bare"):
        ratios = [a / b for a, b in zip(res["store"]["wall"], res[other]["wall"], strict=True)]
        print(f"  store / {other} wall, per round: {_fmt_ratio(ratios)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sync", choices=("on", "off"), default="on")
    ap.add_argument("--n", type=int, default=300, help="appends per contender per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--trees", nargs="*", default=[], help="source trees to compare (a child process per tree)")
    ap.add_argument("--inner", type=int, default=3, help="with --trees: rounds inside each child")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.sync, args.n, args.inner)))
        return
    print(f"synchronous_commit={args.sync}, {args.n} appends per contender per round, load {os.getloadavg()}")
    if not args.trees:
        res = child(args.sync, args.n, args.rounds)
        report("this tree", res)
        out: dict[str, Any] = {"this tree": res}
    else:
        merged: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in args.trees}
        for r in range(args.rounds):
            order = args.trees if r % 2 == 0 else args.trees[::-1]
            for tree in order:
                env = {**os.environ, "PG_PROBE_TREE": str(Path(tree).resolve())}
                argv = [sys.executable, __file__, "--child", "--sync", args.sync, "--n", str(args.n),
                        "--inner", str(args.inner)]  # fmt: skip
                done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree)
                for name, d in json.loads(done.stdout.splitlines()[-1]).items():
                    for m, vals in d.items():
                        merged[tree].setdefault(name, {}).setdefault(m, []).extend(vals)
        for tree in args.trees:
            report(tree, merged[tree])
        out = merged
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
