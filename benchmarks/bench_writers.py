"""Many writers: 4 or 8 processes appending to one ledger file vs 1 process; nothing may be lost.

Each writer is a real process running the Ledger command path
(`record_trusted_state` on its own share of 100 candidates, tiny files hashed on disk;
or, for contention, on the same 10 candidates as every other writer). Writers
get ready (imports, open the ledger), then start together on a go-file; throughput is
commands / (last end - first start); each writer also reports the CPU its command loop
took (info: CPU per command summed over the writers). After every round we check that the event count
grew by exactly the commands that succeeded, that every event id a writer was handed
back is in the file, and at the end that the hash chain verifies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_append import N_CANDIDATES, cid_of, seed_candidates, tiny_files
from bench_common import ACTOR, Row, fmt_spread, interleaved, median, per_round_ratio, remove_db, summary

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store.open import open_store

WRITERS = 4
SHARED = 10  # candidates every writer works on in the contention rows


def _worker(db: str, sync: str, index: int, writers: int, n: int, folder: str, shared: bool = False) -> None:
    """One writer process: commands round-robin over its own share of the candidates, or
    (`shared`) over the same 10 candidates as every other writer (contention: a writer
    whose stream moved under it re-folds and retries)."""
    files = tiny_files(Path(folder))  # already there: returns the same paths
    mine = list(range(SHARED)) if shared else [i for i in range(N_CANDIDATES) if i % writers == index]
    if shared:  # each writer starts at another place in the shared list
        mine = mine[index % SHARED :] + mine[: index % SHARED]
    ledger = Ledger.open(db, synchronous=sync, actor=f"{ACTOR}-w{index}")
    ledger.candidate(cid_of(mine[0]))  # warm: statement cache, page cache
    Path(folder, f"ready-{index}").touch()
    go = Path(folder, "go")
    while not go.exists():
        time.sleep(0.0005)
    start, cpu = time.time(), time.process_time()
    ids: list[str] = []
    failures: list[str] = []
    for k in range(n):
        j = mine[k % len(mine)]
        try:
            result = ledger.record_trusted_state(cid_of(j), "prompt_queue", files[j])
            ids.extend(e.event_id for e in result.events)
        except Exception as e:  # counted and reported, never hidden
            failures.append(f"{type(e).__name__}: {e}")
    end, cpu = time.time(), time.process_time() - cpu
    ledger.close()
    print(json.dumps({"start": start, "end": end, "cpu": cpu, "event_ids": ids, "failures": failures}))


def _round(folder: Path, db: Path | str, sync: str, writers: int, n: int, shared: bool = False) -> dict[str, Any]:
    for f in folder.glob("ready-*"):
        f.unlink()
    (folder / "go").unlink(missing_ok=True)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "worker",
                str(db),
                sync,
                str(i),
                str(writers),
                str(n),
                str(folder),
                "shared" if shared else "own",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    deadline = time.time() + 120
    while len(list(folder.glob("ready-*"))) < writers:
        if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("writers did not get ready: " + " | ".join(p.stderr.read() for p in procs if p.stderr))
        time.sleep(0.005)
    store = open_store(str(db), synchronous=sync)
    before = store.count_events()
    store.close()
    (folder / "go").touch()
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"writer failed: {err}")
        docs.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(d["end"] for d in docs) - min(d["start"] for d in docs)
    ids = [i for d in docs for i in d["event_ids"]]
    store = open_store(str(db), synchronous=sync)
    after = store.count_events()
    missing = sum(store.event_by_id(i) is None for i in ids)
    store.close()
    return {
        "commands": writers * n,
        "appended": len(ids),
        "failures": [f for d in docs for f in d["failures"]],
        "grew_by": after - before,
        "missing": missing,
        "distinct": len(set(ids)),
        "wall_s": wall,
        "throughput": len(ids) / wall,
        # CPU the writers spent per command (their loops only): waiting costs show here even when
        # a busy machine hides them in the throughput
        "cpu_us_per_cmd": sum(d["cpu"] for d in docs) / max(1, writers * n) * 1e6,
    }


def writers_bench(
    workdir: Path,
    sync: str,
    rounds: int,
    n: int,
    target: str | None = None,
    label: str = "",
    writers: int = WRITERS,
    shared: bool = False,
    goal: float = 0.8,
) -> tuple[list[Row], dict[str, Any]]:
    """`target`: a PostgreSQL URL (an empty schema) instead of a fresh SQLite file in `workdir`."""
    how = "shared" if shared else "own"
    folder = workdir / f"writers{label}-{writers}-{how}-{sync.lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    tiny_files(folder)
    db: Path | str = folder / "ledger.db" if target is None else target
    if target is None:
        remove_db(folder / "ledger.db")
    with Ledger.open(db, synchronous=sync, actor=ACTOR) as ledger:
        seed_candidates(ledger.store, [cid_of(i) for i in range(N_CANDIDATES)])
    log: dict[str, list[dict[str, Any]]] = {"one": [], "many": []}

    def one() -> float:
        r = _round(folder, db, sync, 1, n * writers, shared)  # the same total work in one process
        log["one"].append(r)
        return float(r["throughput"])

    def many() -> float:
        r = _round(folder, db, sync, writers, n, shared)
        log["many"].append(r)
        return float(r["throughput"])

    tput = interleaved({"one": one, "many": many}, rounds)
    store = open_store(str(db), synchronous=sync)
    chain = store.verify_chain()
    store.close()
    runs = log["one"] + log["many"]
    lost = sum(r["commands"] - r["appended"] - len(r["failures"]) for r in runs)
    lost += sum(r["missing"] for r in runs) + sum(r["appended"] - r["grew_by"] for r in runs)
    lost += sum(r["appended"] - r["distinct"] for r in runs)
    failures = sum(len(r["failures"]) for r in runs)
    ok = chain.ok and lost == 0 and failures == 0
    ratio = per_round_ratio(tput["many"], tput["one"])
    cpu = {k: [r["cpu_us_per_cmd"] for r in log[k]] for k in ("one", "many")}
    cpu_ratio = per_round_ratio(cpu["many"], cpu["one"])
    rows = [
        Row(f"writers{label}", f"{writers} writers / 1 writer throughput, {how} candidates, {sync}",
            f">= {goal}x" if goal else "-",
            f"1: {fmt_spread(tput['one'], 0)} cmd/s, {writers}: {fmt_spread(tput['many'], 0)} cmd/s",
            median(ratio), (median(ratio) >= goal) if goal else None, {"ratio": summary(ratio)}),
        Row(f"writers{label}", f"{writers} writers lose nothing, {how} candidates, {sync}", "0 lost, chain ok",
            f"{sum(r['appended'] for r in runs):,} appended, {lost} lost, {failures} failed, "
            f"chain {'ok' if chain.ok else 'BROKEN'} ({chain.events:,} events)", None, ok),
    ]  # fmt: skip
    if target is None:  # the client's CPU alone says little of a PostgreSQL server's work
        rows.insert(
            1,
            Row(
                f"writers{label}",
                f"{writers} writers / 1 writer CPU per command, {how} candidates, {sync} (info)",
                "-",
                f"1: {fmt_spread(cpu['one'], 0)} us, {writers}: {fmt_spread(cpu['many'], 0)} us",
                median(cpu_ratio),
                None,
                {"ratio": summary(cpu_ratio)},
            ),
        )
    detail = {
        "commands_per_writer": n,
        "throughput_cmd_s": {k: summary(v, 1, 1) for k, v in tput.items()},
        "cpu_us_per_cmd": {k: summary(v, 1, 1) for k, v in cpu.items()},
        "failures": sorted({f for r in runs for f in r["failures"]})[:10],
        "rounds": log,
    }
    return rows, detail


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    # (writers, shared candidates?, synchronous, target): the targets are for NORMAL;
    # contention on shared candidates is reported for information.
    plan = [
        (4, False, "NORMAL", 0.9), (8, False, "NORMAL", 0.8), (4, False, "FULL", 0.8),
        (4, True, "NORMAL", 0.0), (8, True, "NORMAL", 0.0),
    ]  # fmt: skip
    for writers, shared, sync, goal in plan:
        per = (1000 if quick else 2000) // writers if sync == "NORMAL" else (400 if quick else 800) // writers
        r, d = writers_bench(workdir, sync, rounds, per, writers=writers, shared=shared, goal=goal)
        rows += r
        details[f"{writers}-{'shared' if shared else 'own'}-{sync}"] = d
        print(f"  writers {writers} {'shared' if shared else 'own'} {sync}: done", flush=True)
    return rows, details


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "worker":
        _, _, db_, sync_, index_, writers_, n_, folder_, how_ = sys.argv
        _worker(db_, sync_, int(index_), int(writers_), int(n_), folder_, how_ == "shared")
        sys.stdout.flush()
        os._exit(0)
    raise SystemExit("usage: bench_writers.py worker DB SYNC INDEX WRITERS N FOLDER own|shared (run benchmarks/run.py)")
