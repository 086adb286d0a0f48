"""A realistic command mix through the public API, each command type reported separately.

Every candidate goes through the same seven commands, as a training run drives them:
`receive` (manifest read, adapter hashed), `trusted prompt_queue`, `trusted trajectories`
(a small file hashed each), `check` (the candidate adapter and the SFT baseline hashed,
freshness rules), `fail reward` (trusted states re-hashed, a recovery planned),
`recovered`, `check` again. Files are small (an adapter of 4 KiB weights + its config):
the figures are the ledger's own cost, not disk bandwidth.

Contenders, each on its own file in one folder, WAL, the same `synchronous`:
- ours: the mix above through `Ledger` (new candidates every round);
- raw: `BEGIN IMMEDIATE; INSERT; COMMIT` of the same payload texts our warm-up round
  wrote (same types, same sizes, in the same order), hashes computed up front, into a
  table with the same columns and UNIQUE constraints;
- raw into the store's own table (info): the same, into a file the store created (its
  filter indexes and triggers too): what the schema alone costs;
- eventsourcing: `repository.get` (cache on) + a command method carrying the same payload
  + `save`, one event per command.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_append import Raw, es_app, raw_store_rows
from bench_common import ACTOR, Row, clock, fmt_spread, interleaved, median, per_round_ratio, remove_db, summary

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.fixtures import baseline_manifest, candidate_manifest, write_adapter, write_manifest
from lifecycle_fsm.ledger import Ledger

COMMANDS = ("receive", "trusted", "check", "fail", "recovered")


class Workspace:
    """The SFT baseline, one adapter + manifest per candidate, trusted-state files."""

    def __init__(self, root: Path, count: int) -> None:
        self.root = root
        sft = write_adapter(root / "sft" / "adapter", "sft", b"\x01" * 4096)
        self.sft_sha = hash_directory(str(sft))
        self.baseline = write_manifest(root / "sft" / "manifest.json", baseline_manifest(self.sft_sha))
        self.manifests: list[Path] = []
        self.trusted: list[dict[str, str]] = []
        for i in range(count):
            home = root / "candidates" / f"c{i:05d}"
            adapter = write_adapter(home / "adapter", f"c{i}", bytes([i % 251]) * 4096)
            manifest = candidate_manifest(
                "grpo", source_policy_version=self.sft_sha, policy_version=f"grpo-c{i:05d}",
                adapter_sha256=hash_directory(str(adapter)),
            )  # fmt: skip
            self.manifests.append(write_manifest(home / "manifest.json", manifest))
            files = {}
            for kind in ("prompt_queue", "trajectories"):
                f = home / "runs" / "stage-sampling" / "step-000120" / kind / "shard-00000-of-00001.jsonl"
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text('{"prompt_id": "p-0001", "seed": 7}\n')
                files[kind] = str(f)
            self.trusted.append(files)


def mix_commands(ledger: Ledger, ws: Workspace, i: int, cid: str) -> list[tuple[str, Callable[[], object]]]:
    """The seven commands of one candidate, in order, with the type each is reported under."""
    files = ws.trusted[i]
    return [
        ("receive", lambda: ledger.receive(ws.manifests[i], candidate_id=cid)),
        ("trusted", lambda: ledger.record_trusted_state(cid, "prompt_queue", files["prompt_queue"])),
        ("trusted", lambda: ledger.record_trusted_state(cid, "trajectories", files["trajectories"])),
        ("check", lambda: ledger.check(cid)),
        ("fail", lambda: ledger.fail_stage(cid, "reward")),
        ("recovered", lambda: ledger.complete_recovery(cid)),
        ("check", lambda: ledger.check(cid)),
    ]


class _Mix:
    def __init__(self, folder: Path, sync: str, per_round: int, rounds: int) -> None:
        self.per_round = per_round
        self.ws = Workspace(folder / "ws", per_round)
        for name in ("ours.db", "raw.db", "raw-store.db", "es.db"):
            remove_db(folder / name)
        self.ledger = Ledger.open(folder / "ours.db", synchronous=sync, actor=ACTOR, artifact_root=folder / "ws")
        self.ledger.init()
        self.ledger.activate_baseline(self.ws.baseline)
        self.next = 0
        self.raw = Raw(folder / "raw.db", sync)
        self.raw_store = Raw(folder / "raw-store.db", sync, table="store")
        self.app = es_app(folder / "es.db", sync)
        self.by_type: dict[str, list[float]] = defaultdict(list)
        self.payloads: list[tuple[str, str, dict[str, Any]]] = []
        self.ours_path = folder / "ours.db"

    def ours(self) -> float:
        times: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        total = 0.0
        n = 0
        for i in range(self.per_round):
            cid = f"mix-{self.next:06d}"
            self.next += 1
            for name, run in mix_commands(self.ledger, self.ws, i, cid):
                t0 = clock()
                run()
                took = clock() - t0
                times[name] += took
                counts[name] += 1
                total += took
                n += 1
        for name, spent in times.items():
            self.by_type[name].append(spent / counts[name])
        return total / n

    def capture_payloads(self) -> None:
        """The payload texts the warm-up round wrote: what raw and eventsourcing write too."""
        import orjson

        conn = sqlite3.connect(self.ours_path)
        rows = conn.execute(
            "SELECT stream_id, type, payload FROM events WHERE stream_id != 'ledger' ORDER BY seq"
        ).fetchall()
        conn.close()
        self.payloads = [(s, t, orjson.loads(p)) for s, t, p in rows]
        self.by_type.clear()

    def raw_one(self, raw: Raw | None = None) -> float:
        raw = self.raw if raw is None else raw
        n = self.per_round * 7
        rows = raw.rows([(f"raw-{self.next}-{s}", t, p) for s, t, p in self.payloads[:n]])
        self.next += 1
        return raw.one_per_tx(rows) / n

    def raw_store_one(self) -> float:
        return self.raw_one(self.raw_store)

    def es(self) -> float:
        n = self.per_round * 7
        app = self.app
        streams: dict[str, Any] = {}
        t0 = clock()
        for stream, type_name, payload in self.payloads[:n]:
            if stream not in streams:
                streams[stream] = app.receive(stream)  # the receive command: a new aggregate, saved
                continue
            agg = app.repository.get(streams[stream])
            agg.record(type_name, payload)
            app.save(agg)
        return (clock() - t0) / n

    def close(self) -> None:
        self.ledger.close()
        self.raw.close()
        self.raw_store.close()
        self.app.close()


def mix(workdir: Path, sync: str, rounds: int, per_round: int) -> tuple[list[Row], dict[str, Any]]:
    folder = workdir / f"mix-{sync.lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    bench = _Mix(folder, sync, per_round, rounds)
    bench.ours()  # warm-up: caches, first-use costs; its payloads are what the others write
    bench.capture_payloads()
    contenders = {"ours": bench.ours, "raw": bench.raw_one, "es": bench.es, "raw_store": bench.raw_store_one}
    times = interleaved(contenders, rounds)
    bench.close()
    ours_raw = per_round_ratio(times["ours"], times["raw"])
    es_ours = per_round_ratio(times["es"], times["ours"])
    floor = per_round_ratio(times["raw_store"], times["raw"])
    ours_floor = per_round_ratio(times["ours"], times["raw_store"])
    us = {k: fmt_spread([x * 1e6 for x in v], 1) for k, v in times.items()}
    rows = [
        Row("append-mix", f"ours mix / raw INSERT+COMMIT of the same rows, {sync}",
            "<= 1.3x" if sync == "FULL" else "<= 2x", f"ours {us['ours']} us/cmd, raw {us['raw']} us",
            median(ours_raw), median(ours_raw) <= (1.3 if sync == "FULL" else 2.0)),
        Row("append-mix", f"eventsourcing get+method+save / ours mix, {sync}",
            ">= 1.8x" if sync == "FULL" else ">= 3x", f"es {us['es']} us/cmd",
            median(es_ours), median(es_ours) >= (1.8 if sync == "FULL" else 3.0)),
        *raw_store_rows("append-mix", sync, f"{us['raw_store']} us", median(floor), median(ours_floor)),
    ]  # fmt: skip
    per_type = {}
    for name in COMMANDS:
        vals = bench.by_type[name]
        ratio = per_round_ratio(vals, times["raw"])
        per_type[name] = {"us": summary(vals, 1e6, 1), "ratio_to_raw": summary(ratio)}
        rows.append(Row("append-mix", f"  `{name}` / raw, {sync} (info)", "-",
                        f"{fmt_spread([v * 1e6 for v in vals], 1)} us", median(ratio)))  # fmt: skip
    detail = {
        "mix": "receive, trusted x2, check, fail reward, recovered, check (per candidate, new candidates each round)",
        "commands_per_round": per_round * 7,
        "us_per_cmd": {k: summary(v, 1e6, 1) for k, v in times.items()},
        "ratios": {
            "ours_raw": summary(ours_raw),
            "es_ours": summary(es_ours),
            "raw_store_raw": summary(floor),
            "ours_raw_store": summary(ours_floor),
        },
        "per_type": per_type,
        "es_synchronous_checked": sorted(bench.app.bench_synchronous),
    }
    return rows, detail


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    for sync in ("NORMAL", "FULL"):
        per_round = (30 if quick else 60) if sync == "NORMAL" else (10 if quick else 20)
        r, d = mix(workdir, sync, rounds, per_round)
        rows += r
        details[f"mix_{sync}"] = d
        print(f"  append mix {sync}: done", flush=True)
    return rows, details
