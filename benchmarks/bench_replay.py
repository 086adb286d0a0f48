"""replay: the fold against decoding the same rows, verify, a checkpoint's worth.

One SQLite ledger is grown through the public `Ledger` API (the command mix, then a
hand-off, for new candidates until it holds 100,000 events; --quick: 25,000). Then, in
interleaved rounds, CPU time of:
- fold: `replay.load_state(store, use_checkpoints=False)`, the whole log folded;
- decode: a plain sqlite3 SELECT of the columns the fold reads, fetched in batches of
  the size the store reads them in, and `orjson.loads` of every payload: the floor;
- verify: `replay.verify(store)` (the chain re-hashed, every transition checked), in one
  process and with two worker processes, each re-hashing a slice of the log and folding
  a share of the streams (wall time: the point of the workers is the second core);
- from a checkpoint: `load_state` after `lifecycle checkpoint` and a 1% tail.
"""

from __future__ import annotations

import resource
import sqlite3
import subprocess
import time
from pathlib import Path

import orjson
from bench_common import (
    Row,
    Settings,
    Workspace,
    cpu,
    interleaved,
    mix_commands,
    new_ledger,
    per_round,
    script,
    sized,
    spread,
)

from lifecycle_fsm import Ledger
from lifecycle_fsm.replay import load_state, verify


def cpu_with_workers() -> float:
    """CPU time of this process and of its child processes that have ended (user + system)."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def decode_same_rows(path: Path) -> int:
    """What the fold reads, without the fold. The columns and the batch size are the SQLite
    store's own choice for its fold reads (a store internal, kept in step by hand)."""
    conn = sqlite3.connect(path)
    loads = orjson.loads
    n = 0
    try:
        cursor = conn.execute("SELECT seq, stream_id, version, type, schema_version, payload FROM events ORDER BY seq")
        while rows := cursor.fetchmany(256):
            for row in rows:
                loads(row[5])
            n += len(rows)
    finally:
        conn.close()
    return n


def grow(ledger: Ledger, ws: Workspace, population: int, events: int, prefix: str) -> int:
    """`events` more events: each candidate of a fixed population is received and goes through
    the command mix, then cycles (two trusted states, a failed stage, recovered, check), so
    the folded state stays the same size while history grows."""
    ids = [f"{prefix}{i:05d}" for i in range(population)]
    added = 0
    for i, cid in enumerate(ids):
        added += sum(len(command().events) for command in mix_commands(ledger, ws, i, cid))
    while added < events:
        for i, cid in enumerate(ids):
            files = ws.trusted[i]
            added += len(ledger.record_trusted_state(cid, "prompt_queue", files["prompt_queue"]).events)
            added += len(ledger.record_trusted_state(cid, "trajectories", files["trajectories"]).events)
            added += len(ledger.fail_stage(cid, "reward").events)
            added += len(ledger.complete_recovery(cid).events)
            added += len(ledger.check(cid).events)
    return added


def run(s: Settings) -> list[Row]:
    folder = s.workdir / "replay"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ledger.db"
    events = sized(100_000, s, least=500)
    population = sized(200, s, least=10)
    with new_ledger(path, s.ws, "OFF") as ledger:
        grow(ledger, s.ws, population, events, "r")
    snap = folder / "checkpointed.db"
    snap.write_bytes(path.read_bytes())  # the same log; this copy gets a checkpoint and a tail
    subprocess.run([script("lifecycle"), "--db", str(snap), "checkpoint"], check=True, capture_output=True)
    with Ledger.open(snap, synchronous="OFF") as ledger:
        grow(ledger, s.ws, population, events // 100, "tail")
    full = Ledger.open(path, synchronous="NORMAL")
    store = full.store
    snapped = Ledger.open(snap, synchronous="NORMAL")
    count = decode_same_rows(path)

    def timed(work: object) -> float:
        t0 = cpu()
        assert callable(work)
        work()
        return cpu() - t0

    verify_cpu: dict[int, list[float]] = {1: [], 2: []}  # this process and its reaped workers, per round

    def checked_verify(workers: int) -> float:
        t0, c0 = time.perf_counter(), cpu_with_workers()
        report = verify(store, workers=workers, target=str(path))
        if not report["ok"] or report["events"] != count:
            raise RuntimeError(f"verify found a problem: {report}")
        verify_cpu[workers].append(cpu_with_workers() - c0)
        return time.perf_counter() - t0

    t = interleaved(
        {
            "fold": lambda: timed(lambda: load_state(store, use_checkpoints=False)),
            "decode": lambda: timed(lambda: decode_same_rows(path)),
            "verify": lambda: checked_verify(1),
            "verify_two": lambda: checked_verify(2),
            "checkpointed": lambda: timed(lambda: load_state(snapped.store)),
        },
        s,
    )
    assert load_state(snapped.store).checkpoint is not None, "the checkpoint was not used"
    full.close()
    snapped.close()
    rate = f"{count:,} events: fold {spread(t['fold'], 'ms', 1e3)}, decode {spread(t['decode'], 'ms', 1e3)}"
    verify_rate = spread([count / x for x in t["verify"]], "events/s", 1)
    two_rate = spread([count / x for x in t["verify_two"]], "events/s", 1)
    return [
        Row(
            "replay.fold",
            "fold rate / decode rate of the same rows at the same batch size",
            "CPU",
            per_round(t["decode"], t["fold"]),
            (">=", 0.8),
            rate,
        ),
        Row(
            "replay.verify_parallel",
            "verify with 2 worker processes / verify in one, rate",
            "wall",
            per_round(t["verify"], t["verify_two"]),
            (">=", 1.6),
            f"{count:,} events: one process {verify_rate}, with workers {two_rate}; CPU (with the workers'): "
            f"one process {spread(verify_cpu[1][s.warmup :], 'ms', 1e3)}, "
            f"with workers {spread(verify_cpu[2][s.warmup :], 'ms', 1e3)}",
        ),
        Row(
            "replay.checkpoint",
            "load from a checkpoint + 1% tail / full fold",
            "CPU",
            per_round(t["checkpointed"], t["fold"]),
            None,
            f"from the checkpoint {spread(t['checkpointed'], 'ms', 1e3)}",
        ),
    ]
