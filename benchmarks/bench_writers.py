"""writers: 1, 4 and 8 writer processes on one ledger, SQLite and PostgreSQL; nothing may be lost.

Each round gives the same work, `record_trusted_state` commands through the public
`Ledger` API on 100 candidates (each writer its own share), to 1, 4 or 8 processes
(forked, so no interpreter start-up is timed). The writers open their ledger, wait at a
barrier, then run; throughput is events / (last writer's end - first writer's start),
wall time: how much work the machine gets through is the point. After each round every
event a writer was handed back must be in the log and the new seqs must be gap-free;
after the last, the chain must verify. SQLite at `synchronous=NORMAL`; PostgreSQL at
`synchronous_commit=on`, where writers can share a flush.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from functools import partial
from typing import Any

from bench_common import (
    ACTOR,
    KIND,
    Row,
    Settings,
    Workspace,
    cpu,
    interleaved,
    new_ledger,
    per_round,
    pg_schema,
    sized,
    spread,
)

from lifecycle_fsm import Ledger
from lifecycle_fsm.replay import verify

CANDIDATES = 100
COUNTS = (1, 4, 8)
ctx = multiprocessing.get_context("fork")


def _writer(target: str, sync: str, index: int, writers: int, n: int, files: list[str], barrier: Any, out: Any) -> None:
    """One writer process: `n` commands round-robin over its own share of the candidates."""
    try:
        mine = [j for j in range(CANDIDATES) if j % writers == index]
        ledger = Ledger.open(target, synchronous=sync, actor=f"{ACTOR}-w{index}")
        ledger.candidate(f"c{mine[0]:05d}")  # connection and caches warm before the clock
        barrier.wait(timeout=120)
    except BaseException as e:
        barrier.abort()  # the others and the parent stop waiting at once
        out.put({"error": f"writer {index} could not start: {e!r}"})
        raise SystemExit(1) from e  # said through the queue: no traceback from the child
    start, used = time.monotonic(), cpu()
    seqs: list[int] = []
    failures: list[str] = []
    for k in range(n):
        j = mine[k % len(mine)]
        try:
            seqs += [e.seq for e in ledger.record_trusted_state(f"c{j:05d}", KIND, files[j]).events]
        except Exception as e:  # counted and reported, never hidden
            failures.append(f"{type(e).__name__}: {e}")
    end, used = time.monotonic(), cpu() - used
    ledger.close()
    out.put({"start": start, "end": end, "cpu": used, "seqs": seqs, "failures": failures})


class Writers:
    """Rounds of k writers on one ledger; every round checked for lost events and gaps."""

    def __init__(self, target: str, sync: str, ws: Workspace, commands: int) -> None:
        self.target, self.sync, self.commands = target, sync, commands
        self.files = [ws.trusted[i][KIND] for i in range(CANDIDATES)]
        with new_ledger(target, ws, sync, CANDIDATES) as ledger:
            self.head = max(e.seq for e in ledger.events())
        self.appended = self.lost = self.gaps = 0
        self.failures: list[str] = []
        self.cpu: dict[int, list[float]] = {k: [] for k in COUNTS}

    def _run(self, writers: int, n: int) -> list[dict[str, Any]]:
        """Start `writers` processes, let them go together, and collect what each reports."""
        barrier, out = ctx.Barrier(writers + 1), ctx.Queue()
        args = [(self.target, self.sync, i, writers, n, self.files, barrier, out) for i in range(writers)]
        procs = [ctx.Process(target=_writer, args=a) for a in args]
        for p in procs:
            p.start()
        try:
            barrier.wait(timeout=120)
            docs = [out.get(timeout=600) for _ in procs]
        except threading.BrokenBarrierError:
            docs = [out.get(timeout=5)]  # the writer that broke it says why
        for p in procs:
            p.join()
        errors = [d["error"] for d in docs if "error" in d] + [f"exit {p.exitcode}" for p in procs if p.exitcode]
        if errors:
            raise RuntimeError(f"writers failed: {errors}")
        return docs

    def round(self, writers: int) -> float:
        n = self.commands // writers
        docs = self._run(writers, n)
        seqs = [s for d in docs for s in d["seqs"]]
        failed = [f for d in docs for f in d["failures"]]
        with Ledger.open(self.target, synchronous=self.sync, create=False) as ledger:
            stored = [e.seq for e in ledger.events(after=self.head)]
        # lost: a command that did not fail whose event is not in the log; a gap: a seq never used
        self.lost += writers * n - len(failed) - len(seqs) + len(set(seqs) - set(stored))
        self.gaps += len(set(range(self.head + 1, self.head + 1 + len(stored))) - set(stored))
        self.failures += failed
        self.appended += len(seqs)
        self.head = stored[-1] if stored else self.head
        self.cpu[writers].append(sum(d["cpu"] for d in docs) / max(1, len(seqs)))
        return len(seqs) / (max(d["end"] for d in docs) - min(d["start"] for d in docs))

    def rows(self, key: str, label: str, t: dict[str, list[float]], target: float | None) -> list[Row]:
        with Ledger.open(self.target, synchronous=self.sync, create=False) as ledger:
            report = verify(ledger.store)
        rows = [
            Row(
                f"writers.{key}.{k}",
                f"{k} writer processes / 1, throughput, {label}",
                "wall",
                per_round(t[str(k)], t["1"]),
                (">=", target) if target and k == COUNTS[-1] else None,
                f"1: {spread(t['1'], 'cmd/s', 1)}, {k}: {spread(t[str(k)], 'cmd/s', 1)}; CPU per command "
                f"1: {spread(self.cpu[1])}, {k}: {spread(self.cpu[k])}",
            )
            for k in COUNTS[1:]
        ]
        ok = self.lost == self.gaps == 0 and not self.failures and report["ok"]
        failed = f"{len(self.failures)} failed" + (f" {self.failures[:2]}" if self.failures else "")
        chain = f"chain {'ok' if report['ok'] else 'BROKEN'} ({report['events']:,} events)"
        figures = f"{self.appended:,} appended, {self.lost} lost, {self.gaps} gaps, {failed}, {chain}"
        what = f"every event stored, seqs gap-free, chain verifies, {label}"
        return [*rows, Row(f"writers.{key}.lost", what, "-", ok=ok, figures=figures)]


def run(s: Settings) -> list[Row]:
    folder = s.workdir / "writers"
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    plan = [
        ("sqlite", "SQLite NORMAL", str(folder / "ledger.db"), "NORMAL", None),
        ("pg", "PostgreSQL synchronous_commit=on", pg_schema(s.pg_url, "writers")[1], "FULL", 1.5),
    ]
    for key, label, target, sync, goal in plan:
        bench = Writers(target, sync, s.ws, sized(800, s, least=len(COUNTS) * COUNTS[-1]))
        t = interleaved({str(k): partial(bench.round, k) for k in COUNTS}, s)
        rows += bench.rows(key, label, t, goal)
    return rows
