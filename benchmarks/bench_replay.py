"""Replay, chain verification, replay memory, checkpoint scaling, explain/status latency.

One ledger file grows through stages (10k, 100k, 1M events; --quick: 10k, 100k) of
realistic candidate streams: a fixed population of 500 candidates cycling through
legal moves (see bench_common.CYCLE), 5 events per stream per append, ~5,000 events per
transaction, plus a window advance per transaction. Holding the population fixed keeps
the folded state the same size (every candidate has been through a full cycle by 10k
events), so what grows between stages is history alone.

At each stage: take a checkpoint at the head, append a tail of 200 events after it and
a short "probe" candidate (13 events), then time on fresh connections:
- `Ledger.candidate` for a long-lived candidate (its stream grows with history) and for
  the probe (a stream of 13 events);
- `load_state` (latest checkpoint + tail);
and the peak memory of a full replay in a subprocess at 100k and 1M (--quick: 20k and
100k; a younger ledger has not yet reached its largest state). At the
last stage: full fold vs raw SELECT + orjson.loads, `verify_chain`, explain and status.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import bench_trust
import orjson
from bench_common import (
    Row,
    Streams,
    clock,
    extend_ledger,
    fmt_spread,
    interleaved,
    median,
    per_round_ratio,
    summary,
)

from lifecycle_fsm.cli.render import candidate_json
from lifecycle_fsm.ledger import Ledger, utc_now
from lifecycle_fsm.replay import load_state, take_checkpoint
from lifecycle_fsm.replay.explain import explain
from lifecycle_fsm.store.sqlite import SQLiteEventStore

POPULATION = 500  # 20 events each by 10k: every candidate has completed a full cycle (14 events)
TAIL = 200
PROBE_EVENTS = 13
LONG_ID = "grpo-v7-c0000"


def _ids() -> list[str]:
    return [f"grpo-v7-c{i:04d}" for i in range(POPULATION)]


def _open(path: Path) -> SQLiteEventStore:
    return SQLiteEventStore(path, synchronous="NORMAL")


def _timed(fn: Any) -> float:
    t0 = clock()
    fn()
    return clock() - t0


# --- stage measurements -------------------------------------------------------------------


def checkpoint_stage(path: Path, streams: Streams, probe: str, rounds: int) -> dict[str, Any]:
    """Checkpoint at the head, a tail after it, then time the three reads."""
    store = _open(path)
    t_cp = _timed(lambda: take_checkpoint(store, clock=utc_now))
    extend_ledger(store, streams, _ids(), TAIL, start=7)
    expected, events, state = streams.take(probe, PROBE_EVENTS)
    store.append(events[0].stream_id, expected, events, status=state, category="grpo")
    head = store.head().seq
    store.close()

    def fresh(fn: Any) -> float:
        s = _open(path)
        try:
            return _timed(lambda: fn(s))
        finally:
            s.close()

    def load(s: SQLiteEventStore) -> None:
        result = load_state(s)
        assert result.checkpoint is not None
        assert result.state.position == head

    times = interleaved(
        {
            "candidate_long": lambda: fresh(lambda s: Ledger(s).candidate(LONG_ID)),
            "candidate_probe": lambda: fresh(lambda s: Ledger(s).candidate(probe)),
            "load_state": lambda: fresh(load),
        },
        rounds,
    )
    return {"events": head, "take_checkpoint_s": round(t_cp, 3), "times": times}


FOLD_COLUMNS = "seq, stream_id, version, type, schema_version, payload"


def raw_decode(path: Path) -> int:
    """The floor for replay: SELECT the fold's six columns in seq order (the same rows the
    fold reads, same batch size), `orjson.loads` of every payload, nothing else."""
    conn = sqlite3.connect(path)
    loads = orjson.loads
    n = 0
    try:
        cur = conn.execute(f"SELECT {FOLD_COLUMNS} FROM events ORDER BY seq")
        while rows := cur.fetchmany(256):
            for row in rows:
                loads(row[5])
            n += len(rows)
    finally:
        conn.close()
    return n


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def replay_final(path: Path, rounds: int) -> tuple[list[Row], dict[str, Any]]:
    """Full fold vs raw decode (interleaved), then chain verification."""
    store = _open(path)
    events = store.count_events()

    # CPU time (process_time here, the child's rusage for the CLI): on a machine loaded
    # several times over its cores, wall time is mostly the wait for a core.
    cpu = time.process_time

    def fold() -> float:
        t0 = cpu()
        state = load_state(store, use_checkpoints=False).state
        elapsed = cpu() - t0
        assert state.position == events
        return elapsed

    def raw() -> float:
        t0 = cpu()
        assert raw_decode(path) == events
        return cpu() - t0

    times = interleaved({"fold": fold, "raw": raw}, rounds)
    verify_rounds = max(3, rounds - 2)
    verify = []
    for _ in range(verify_rounds):
        t0 = cpu()
        report = store.verify_chain()
        verify.append(cpu() - t0)
        assert report.ok
        assert report.events == events
    store.close()
    cli_verify = []
    for _ in range(verify_rounds):  # the whole `lifecycle verify` process: chain, checkpoints, transitions
        t0 = _children_cpu()
        done = subprocess.run([*_cli(), "--db", str(path), "--json", "verify"], check=True, capture_output=True)
        cli_verify.append(_children_cpu() - t0)
        assert json.loads(done.stdout)["ok"], done.stderr[-2000:]
    ratio = [r / f for f, r in zip(times["fold"], times["raw"], strict=True)]  # fold rate / raw rate
    fold_rate = [events / t / 1e3 for t in times["fold"]]
    raw_rate = [events / t / 1e3 for t in times["raw"]]
    verify_rate = [events / t / 1e3 for t in verify]
    cli_rate = [events / t / 1e3 for t in cli_verify]
    rows = [
        Row("replay", f"fold rate / same 6 columns SELECT+orjson.loads rate, {events:,} events", ">= 0.6x",
            f"fold {fmt_spread(fold_rate, 0)}k ev/s, raw {fmt_spread(raw_rate, 0)}k ev/s",
            median(ratio), median(ratio) >= 0.6, {"ratio": summary(ratio)}),
        Row("replay", f"verify_chain rate in process, {events:,} events", ">= 300k ev/s",
            f"{fmt_spread(verify_rate, 0)}k ev/s", median(verify_rate) / 300, median(verify_rate) >= 300,
            {"kevents_per_s": summary(verify_rate, 1, 1)}),
        _cli_verify_row(events, cli_rate),
    ]  # fmt: skip
    detail = {
        "events": events,
        "fold_s": summary(times["fold"]),
        "raw_s": summary(times["raw"]),
        "verify_s": summary(verify),
        "cli_verify_s": summary(cli_verify),
        "clock": "CPU time: process_time in process, the child's user + system for the CLI",
    }
    return rows, detail


# Issue #13 sets the CLI `verify` target on a 1M-event ledger: below that, the fixed start-up is
# a large share of the process, so a smaller ledger (--quick: 100k) reports the rate for information.
CLI_VERIFY_TARGET_EVENTS = 1_000_000


def _cli_verify_row(events: int, cli_rate: list[float]) -> Row:
    detail = {"kevents_per_s": summary(cli_rate, 1, 1)}
    if events >= CLI_VERIFY_TARGET_EVENTS:
        return Row("replay", f"CLI `lifecycle verify` whole process, {events:,} events", ">= 150k ev/s",
                   f"{fmt_spread(cli_rate, 0)}k ev/s", median(cli_rate) / 150, median(cli_rate) >= 150,
                   detail)  # fmt: skip
    return Row("replay", f"CLI `lifecycle verify` whole process, {events:,} events (info: the >= 150k ev/s "
               "target is taken at 1,000,000 events)", "-", f"{fmt_spread(cli_rate, 0)}k ev/s",
               median(cli_rate) / 150, None, detail)  # fmt: skip


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("lifecycle")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lifecycle_fsm"]


def stale_checkpoints(
    path: Path, streams: Streams, position: int, lags: list[int], rounds: int
) -> tuple[list[Row], dict[str, Any]]:
    """A checkpoint left behind: `load_state` with the checkpoint `lag` events back, vs a
    full fold, on the same file in the same round. The tail also brings new candidates
    (a growing population: one new candidate per 50 tail events)."""
    store = _open(path)
    take_checkpoint(store, clock=utc_now)
    base = store.count_events()
    store.close()
    rows: list[Row] = []
    detail: dict[str, Any] = {}
    grown = 0
    for lag in sorted(lags):
        store = _open(path)
        newcomers = [f"grow-c{i:05d}" for i in range(lag // 50)]
        position = extend_ledger(store, streams, _ids() + newcomers, base + lag - store.count_events(), start=position)
        grown = len(newcomers)
        head = store.head().seq
        store.close()

        def fresh(use: bool, head: int = head) -> float:
            s = _open(path)
            try:
                t0 = clock()
                result = load_state(s, use_checkpoints=use)
                took = clock() - t0
                assert result.state.position == head
                assert (result.checkpoint is not None) == use
                return took
            finally:
                s.close()

        times = interleaved({"stale": lambda: fresh(True), "full": lambda: fresh(False)}, rounds)
        ratio = per_round_ratio(times["stale"], times["full"])
        rows.append(Row(
            "checkpoint", f"load_state, checkpoint {lag:,} events behind / full fold ({head:,} events, info)", "-",
            f"stale {fmt_spread([x * 1e3 for x in times['stale']], 1)} ms, "
            f"full {fmt_spread([x * 1e3 for x in times['full']], 1)} ms", median(ratio),
        ))  # fmt: skip
        detail[lag] = {"events": head, "new_candidates": grown, **{k: summary(v, 1e3, 2) for k, v in times.items()}}
    return rows, detail


def memory_in_subprocess(path: Path) -> dict[str, Any]:
    """Peak memory of a full replay, measured in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, "memory", str(path)], capture_output=True, text=True, check=True, timeout=1800
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _peak_rss_kb() -> int:
    """Peak RSS of this process image: VmHWM (reset by exec), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    # ru_maxrss survives execve on Linux (it may hold the parent's peak): a fallback only
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _memory_child(path: str) -> None:
    store = SQLiteEventStore(path, synchronous="NORMAL")
    base_kb = _peak_rss_kb()
    t0 = time.perf_counter()
    state = load_state(store, use_checkpoints=False).state
    elapsed = time.perf_counter() - t0
    peak_kb = _peak_rss_kb()
    candidates = len(state.candidates)
    del state
    tracemalloc.start()
    load_state(store, use_checkpoints=False)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    doc = {
        "events": store.count_events(), "candidates": candidates, "fold_s": round(elapsed, 3),
        "rss_after_imports_kb": base_kb, "rss_peak_kb": peak_kb, "tracemalloc_peak_bytes": traced_peak,
    }  # fmt: skip
    print(json.dumps(doc))


def latency(path: Path, probe: str, rounds: int) -> tuple[list[Row], dict[str, Any]]:
    """explain and status on the largest ledger: in-process and as the CLI a user runs."""

    def fresh(fn: Any) -> float:
        s = _open(path)
        try:
            return _timed(lambda: fn(s))
        finally:
            s.close()

    def status_all(s: SQLiteEventStore) -> None:
        states = load_state(s).state.candidates
        [candidate_json(c) for _, c in sorted(states.items())]

    def cli(*args: str) -> float:
        t0 = clock()
        subprocess.run(
            [sys.executable, "-m", "lifecycle_fsm", "--db", str(path), "--json", *args],
            capture_output=True, check=True, timeout=600,
        )  # fmt: skip
        return clock() - t0

    contenders = {
        "explain_long": lambda: fresh(lambda s: explain(s, LONG_ID)),
        "explain_probe": lambda: fresh(lambda s: explain(s, probe)),
        "status_id": lambda: fresh(lambda s: candidate_json(Ledger(s).candidate(LONG_ID))),
        "status_all": lambda: fresh(status_all),
        "cli_explain_long": lambda: cli("explain", LONG_ID),
        "cli_status_id": lambda: cli("status", LONG_ID),
        "cli_status_all": lambda: cli("status"),
    }
    times = interleaved(contenders, rounds)
    s = _open(path)
    events = s.count_events()
    long_len = len(s.read_stream(f"candidate:{LONG_ID}"))
    s.close()
    labels = {
        "explain_long": f"explain, long-lived candidate ({long_len:,} events)",
        "explain_probe": f"explain, recent candidate ({PROBE_EVENTS} events)",
        "status_id": f"status ID (fresh Ledger.candidate, {long_len:,} events)",
        "status_all": f"status (checkpoint + tail, {POPULATION + 1:,} candidates)",
        "cli_explain_long": "CLI `explain ID --json` wall (incl. interpreter start)",
        "cli_status_id": "CLI `status ID --json` wall",
        "cli_status_all": "CLI `status --json` wall",
    }
    rows = [
        Row("latency", f"{labels[k]} @ {events:,} events", "-", f"{fmt_spread([x * 1e3 for x in v], 1)} ms")
        for k, v in times.items()
    ]
    return rows, {k: summary(v, 1e3, 2) for k, v in times.items()} | {"long_stream_events": long_len}


# --- the stages ------------------------------------------------------------------------------


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    stages = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    # Replay memory is compared over a 5-10x growth of history once every candidate has
    # been through its largest phase (the peak plateaus after ~12k events here).
    memory_points = [20_000, 100_000] if quick else [100_000, 1_000_000]
    path = workdir / "big.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    streams = Streams()
    ids = _ids()
    position = 0
    details: dict[str, Any] = {"population": POPULATION, "stages": {}, "build_s": {}}
    memory: dict[int, dict[str, Any]] = {}
    replay_rows: list[Row] = []
    stage_times: dict[int, dict[str, Any]] = {}
    for target in sorted(set(stages) | set(memory_points)):
        store = _open(path)
        t0 = clock()
        position = extend_ledger(store, streams, ids, target - store.count_events(), start=position)
        details["build_s"][target] = round(clock() - t0, 2)
        built = store.count_events()
        store.close()
        print(f"  ledger at {built:,} events (built in {details['build_s'][target]} s)", flush=True)
        if target in memory_points:
            memory[target] = memory_in_subprocess(path)
            print(f"  replay memory at {target:,}: {memory[target]}", flush=True)
        if target == stages[-1]:
            replay_rows, details["replay"] = replay_final(path, rounds)
            print("  replay and verify: done", flush=True)
        if target in stages:
            stage = checkpoint_stage(path, streams, f"probe-{target}", rounds)
            stage_times[target] = stage
            details["stages"][target] = {
                "events": stage["events"],
                "take_checkpoint_s": stage["take_checkpoint_s"],
                **{k: summary(v, 1e3, 2) for k, v in stage["times"].items()},
            }
            print(f"  checkpoint stage {target:,}: done", flush=True)
    latency_rows, details["latency"] = latency(path, f"probe-{stages[-1]}", rounds)
    stale_rows, details["stale_checkpoints"] = stale_checkpoints(
        path, streams, position, [10_000, 50_000] if quick else [10_000, 100_000], rounds
    )
    latency_rows += stale_rows
    trust_rows, details["trust"] = bench_trust.run(path, LONG_ID, rounds)  # appends seals: last
    print("  trust (verify --pubkey, re-hashed reads): done", flush=True)
    details["memory"] = memory
    details["payload_bytes_mean"] = _mean_payload(path)
    rows = replay_rows + _memory_rows(memory) + _checkpoint_rows(stage_times) + latency_rows + trust_rows
    return rows, details


def _mean_payload(path: Path) -> float:
    conn = sqlite3.connect(path)
    try:
        return round(float(conn.execute("SELECT avg(length(payload)) FROM events").fetchone()[0]), 1)
    finally:
        conn.close()


def _memory_rows(memory: dict[int, dict[str, Any]]) -> list[Row]:
    small, big = sorted(memory)
    a, b = memory[small], memory[big]
    traced = b["tracemalloc_peak_bytes"] / a["tracemalloc_peak_bytes"]
    rss = b["rss_peak_kb"] / a["rss_peak_kb"]
    return [
        Row("replay", f"replay peak heap (tracemalloc) {small:,} -> {big:,}", "<= 1.2x",
            f"{a['tracemalloc_peak_bytes'] / 2**20:.1f} -> {b['tracemalloc_peak_bytes'] / 2**20:.1f} MiB",
            traced, traced <= 1.2),
        Row("replay", f"replay peak RSS (VmHWM) {small:,} -> {big:,} (info)", "-",
            f"{a['rss_peak_kb'] / 1024:.1f} -> {b['rss_peak_kb'] / 1024:.1f} MiB "
            f"(after imports {b['rss_after_imports_kb'] / 1024:.1f})", rss),
    ]  # fmt: skip


def _checkpoint_rows(stage_times: dict[int, dict[str, Any]]) -> list[Row]:
    first, last = min(stage_times), max(stage_times)
    names = {
        "load_state": "load_state (checkpoint near head + tail)",
        "candidate_probe": f"Ledger.candidate, recent candidate ({PROBE_EVENTS} events)",
        "candidate_long": "Ledger.candidate, long-lived candidate (stream grows with history)",
    }
    rows = []
    for key, label in names.items():
        a = stage_times[first]["times"][key]
        b = stage_times[last]["times"][key]
        ratio = median(b) / median(a)
        measured = " -> ".join(
            f"{fmt_spread([x * 1e3 for x in stage_times[s]['times'][key]], 2)} ms" for s in sorted(stage_times)
        )
        rows.append(Row("checkpoint", f"{label} {first:,} -> {last:,}", "<= 2x", measured, ratio, ratio <= 2.0))
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "memory":
        _memory_child(sys.argv[2])
        sys.stdout.flush()
        os._exit(0)
    raise SystemExit("usage: bench_replay.py memory DB (run benchmarks/run.py for the benchmarks)")
