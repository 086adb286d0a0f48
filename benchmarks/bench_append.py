"""Append cost: one command per transaction, and 1,000 events per transaction.

Contenders, each on its own file in the same folder, WAL, the same `synchronous`:
- ours: `Ledger.record_trusted_state` (kind check, path exists, sha256 of a tiny file on
  disk, FSM check, canonical JSON, hash chain, INSERT, stream index upsert, COMMIT),
  round-robin over 100 candidates;
- raw: `BEGIN IMMEDIATE; INSERT; COMMIT` of an equivalent row (same columns, same
  payload text, same UNIQUE constraints, no triggers, values computed up front);
- raw into the store's own table (info): the same rows into a file `SQLiteEventStore`
  created (three filter indexes, the insert trigger): the schema's share of the gap;
- eventsourcing 9.x, SQLite persistence: the documented command pattern
  (`repository.get` with the aggregate cache on, call the command method, `save`),
  one event per save; "es save only" keeps the aggregates in memory (info).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from bench_common import (
    ACTOR,
    Clock,
    Row,
    Streams,
    clock,
    fmt_spread,
    interleaved,
    median,
    per_round_ratio,
    remove_db,
    sha_of,
    summary,
)

from lifecycle_fsm.events import TrustedStateRecorded, stream_of
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore

N_CANDIDATES = 100
KIND = "prompt_queue"
RAW_SCHEMA = """CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, version INTEGER NOT NULL, event_id TEXT NOT NULL,
    type TEXT NOT NULL, schema_version INTEGER NOT NULL, payload TEXT NOT NULL, recorded_at TEXT NOT NULL,
    actor TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
    UNIQUE (stream_id, version), UNIQUE (event_id))"""
RAW_INSERT = "INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?)"


def cid_of(i: int) -> str:
    return f"grpo-v7-lr3e-6-c{i:03d}"


def tiny_files(root: Path, n: int = N_CANDIDATES) -> list[str]:
    """One tiny trusted-state file per candidate, at a realistic run path."""
    paths = []
    for i in range(n):
        run = f"2025-06-01T08-30-00_grpo-v7_lr3e-6_beta0.04_kl0.02_seed{i:03d}"
        folder = root / "runs" / run / cid_of(i) / "stage-sampling" / "step-000120" / "trusted-states" / "prompt_queue"
        folder.mkdir(parents=True, exist_ok=True)
        f = folder / "shard-00000-of-00001.jsonl"
        if not f.exists():  # never rewritten: a writer may be hashing it
            f.write_text('{"prompt_id": "p-0001", "seed": 7}\n')
        paths.append(str(f))
    return paths


def seed_candidates(store: SQLiteEventStore, ids: list[str]) -> None:
    """Ledger settings and one CandidateReceived per id, in one transaction."""
    streams = Streams()
    with store.transaction() as tx:
        expected, events = streams.ledger_events()
        tx.append("ledger", expected, events)
        for cid in ids:
            expected, events, state = streams.take(cid, 1)
            tx.append(stream_of(cid), expected, events, status=state, category="grpo")


# --- raw sqlite3 ---------------------------------------------------------------------------


class Raw:
    """Plain sqlite3 on an equivalent table: the floor we compare against.

    `table="bare"` (the targets' raw): the events table's columns, PRIMARY KEY and two
    UNIQUEs, nothing else. `table="store"` (info rows): the store's own file, created by
    `SQLiteEventStore` (its three filter indexes, the insert trigger that refuses a
    clashing row, the update/delete triggers); raw still skips everything the store
    does around the INSERT (write lock, head read, chain, version check, stream index).
    """

    def __init__(self, path: Path, sync: str, table: str = "bare") -> None:
        if table == "store":
            SQLiteEventStore(path, synchronous=sync).close()
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={sync}")
        if table == "store":
            self.conn.execute("PRAGMA recursive_triggers=ON")  # as the store's own connection
        else:
            self.conn.execute(RAW_SCHEMA)
        self.seq = int(self.conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
        self.versions: dict[str, int] = {}
        self.clock = Clock()

    def rows(self, payloads: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
        """Rows as our store would write them (stream, type, canonical payload), hashes precomputed."""
        out = []
        for stream, type_name, payload in payloads:
            self.seq += 1
            version = self.versions[stream] = self.versions.get(stream, 0) + 1
            out.append((
                self.seq, stream, version, uuid.uuid4().hex, type_name, 1, canonical_json(payload),
                self.clock(), ACTOR, sha_of(self.seq - 1), sha_of(self.seq),
            ))  # fmt: skip
        return out

    def one_per_tx(self, rows: list[tuple[Any, ...]]) -> float:
        conn = self.conn
        t0 = clock()
        for row in rows:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(RAW_INSERT, row)
            conn.execute("COMMIT")
        return clock() - t0

    def batch(self, rows: list[tuple[Any, ...]]) -> float:
        t0 = clock()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(RAW_INSERT, rows)
        self.conn.execute("COMMIT")
        return clock() - t0

    def close(self) -> None:
        self.conn.close()


# --- eventsourcing ---------------------------------------------------------------------------


def _es_classes() -> tuple[type, type]:
    from eventsourcing.application import Application  # type: ignore[import-untyped]
    from eventsourcing.domain import Aggregate, event  # type: ignore[import-untyped]

    class Candidate(Aggregate):  # type: ignore[misc]
        @event("Received")  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            self.name = name
            self.trusted: dict[str, Any] = {}

        @event("TrustedStateRecorded")  # type: ignore[misc]
        def record_trusted_state(self, kind: str, path: str, sha256: str) -> None:
            self.trusted[kind] = (path, sha256)

        @event("Recorded")  # type: ignore[misc]
        def record(self, type_name: str, payload: dict[str, Any]) -> None:
            self.last = type_name

    class CandidateApp(Application):  # type: ignore[misc]
        def receive(self, name: str) -> Any:
            c = Candidate(name)
            self.save(c)
            return c.id

        def record_trusted_state(self, cid: Any, kind: str, path: str, sha256: str) -> None:
            c = self.repository.get(cid)
            c.record_trusted_state(kind, path, sha256)
            self.save(c)

    return CandidateApp, Candidate


_ES: tuple[type, type] | None = None


def es_app(path: Path, sync: str) -> Any:
    """An eventsourcing Application on SQLite at `path`, every connection at `synchronous=sync`."""
    global _ES  # noqa: PLW0603 - import eventsourcing once, lazily (it is an optional extra)
    if _ES is None:
        _ES = _es_classes()
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path), "AGGREGATE_CACHE_MAXSIZE": "1000"}
    app = _ES[0](env=env)
    pool = app.recorder.datastore.pool
    make = pool._create_connection

    def create() -> Any:  # eventsourcing leaves synchronous at SQLite's default (FULL): set it per connection
        conn = make()
        conn._sqlite_conn.execute(f"PRAGMA synchronous={sync}")
        return conn

    pool._create_connection = create
    for conn in list(pool._pool):
        conn._sqlite_conn.execute(f"PRAGMA synchronous={sync}")
    checked = {conn._sqlite_conn.execute("PRAGMA synchronous").fetchone()[0] for conn in pool._pool}
    app.bench_synchronous = checked
    return app


# --- the benchmarks --------------------------------------------------------------------------


class _Single:
    """The five single-append contenders on their own files in one folder."""

    def __init__(self, folder: Path, sync: str, n: int) -> None:
        self.n = n
        self.files = tiny_files(folder)
        self.ids = [cid_of(i) for i in range(N_CANDIDATES)]
        self.shas = [sha_of(f) for f in self.files]
        for name in ("ours.db", "ours-alt.db", "raw.db", "raw-store.db", "es.db"):
            remove_db(folder / name)
        self.ledger = Ledger.open(folder / "ours.db", synchronous=sync, actor=ACTOR)
        seed_candidates(self.ledger.store, self.ids)
        self.alt = Ledger.open(folder / "ours-alt.db", synchronous=sync, actor=ACTOR)
        seed_candidates(self.alt.store, self.ids)
        self.trusted = [False] * N_CANDIDATES
        self.raw = Raw(folder / "raw.db", sync)
        self.raw_store = Raw(folder / "raw-store.db", sync, table="store")
        self.app = es_app(folder / "es.db", sync)
        self.es_ids = [self.app.receive(cid) for cid in self.ids]
        # separate aggregates for save-only, kept in memory
        self.es_aggs = [self.app.repository.get(self.app.receive(cid)) for cid in self.ids]

    def ours(self) -> float:
        record, ids, files = self.ledger.record_trusted_state, self.ids, self.files
        t0 = clock()
        for i in range(self.n):
            record(ids[i % N_CANDIDATES], KIND, files[i % N_CANDIDATES])
        return (clock() - t0) / self.n

    def ours_alt(self) -> float:
        """untrust / trusted alternating per candidate: half the commands hash a file."""
        t0 = clock()
        for i in range(self.n):
            j = i % N_CANDIDATES
            if self.trusted[j]:
                self.alt.invalidate_trusted_state(self.ids[j], KIND)
            else:
                self.alt.record_trusted_state(self.ids[j], KIND, self.files[j])
            self.trusted[j] = not self.trusted[j]
        return (clock() - t0) / self.n

    def raw_one(self, raw: Raw | None = None) -> float:
        raw = self.raw if raw is None else raw
        payloads = []
        for i in range(self.n):
            j = i % N_CANDIDATES
            ev = TrustedStateRecorded(KIND, self.files[j], self.shas[j])
            payloads.append((stream_of(self.ids[j]), ev.TYPE, ev.to_payload()))
        return raw.one_per_tx(raw.rows(payloads)) / self.n

    def raw_store_one(self) -> float:
        return self.raw_one(self.raw_store)

    def es(self) -> float:
        cmd = self.app.record_trusted_state
        t0 = clock()
        for i in range(self.n):
            j = i % N_CANDIDATES
            cmd(self.es_ids[j], KIND, self.files[j], self.shas[j])
        return (clock() - t0) / self.n

    def es_save(self) -> float:
        t0 = clock()
        for i in range(self.n):
            j = i % N_CANDIDATES
            agg = self.es_aggs[j]
            agg.record_trusted_state(KIND, self.files[j], self.shas[j])
            self.app.save(agg)
        return (clock() - t0) / self.n

    def close(self) -> None:
        for closable in (self.ledger, self.alt, self.raw, self.raw_store, self.app):
            closable.close()


def raw_store_rows(section: str, sync: str, measured: str, floor: float, ours: float) -> list[Row]:
    """Info rows: raw INSERT+COMMIT into the store's own table, against raw and against ours.

    The first says what the store's schema (the guarantees the database keeps: three filter
    indexes, the insert trigger) costs by itself; the second what our code adds on top.
    """
    return [
        Row(section, f"raw into the store's own table (indexes, triggers) / raw, {sync} (info)", "-",
            f"raw-store {measured}", floor),
        Row(section, f"ours / raw into the store's own table, {sync} (info)", "-", "", ours),
    ]  # fmt: skip


def single(workdir: Path, sync: str, rounds: int, n: int) -> tuple[list[Row], dict[str, Any]]:
    """One command (one event) per transaction: ours vs raw vs eventsourcing."""
    folder = workdir / f"single-{sync.lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    bench = _Single(folder, sync, n)
    contenders = {"ours": bench.ours, "raw": bench.raw_one, "es": bench.es, "es_save": bench.es_save,
                  "ours_alt": bench.ours_alt, "raw_store": bench.raw_store_one}  # fmt: skip
    interleaved(contenders, 1)  # warm-up: statement caches, page cache, first-use costs
    times = interleaved(contenders, rounds)
    payload = _payload_len(folder / "ours.db")
    bench.close()
    ratios = {
        "ours_raw": per_round_ratio(times["ours"], times["raw"]),
        "es_ours": per_round_ratio(times["es"], times["ours"]),
        "es_save_ours": per_round_ratio(times["es_save"], times["ours"]),
        "alt_raw": per_round_ratio(times["ours_alt"], times["raw"]),
        "es_alt": per_round_ratio(times["es"], times["ours_alt"]),
        "raw_store_raw": per_round_ratio(times["raw_store"], times["raw"]),
        "ours_raw_store": per_round_ratio(times["ours"], times["raw_store"]),
    }
    m = {k: median(v) for k, v in ratios.items()}
    us = {k: fmt_spread([x * 1e6 for x in v], 1) for k, v in times.items()}
    detail = {
        "command": "Ledger.record_trusted_state(kind=prompt_queue, tiny file) round-robin over 100 candidates",
        "ops_per_round": n,
        "payload_bytes": payload,
        "es_synchronous_checked": sorted(bench.app.bench_synchronous),
        "us_per_op": {k: summary(v, 1e6, 1) for k, v in times.items()},
        "ratios": {k: summary(v) for k, v in ratios.items()},
    }
    rows = [
        Row("append-1", f"ours / raw sqlite3, {sync}", "<= 1.5x", f"ours {us['ours']} us, raw {us['raw']} us",
            m["ours_raw"], m["ours_raw"] <= 1.5),
        Row("append-1", f"eventsourcing / ours, {sync}", ">= 2x", f"es get+save {us['es']} us",
            m["es_ours"], m["es_ours"] >= 2.0),
        Row("append-1", f"es save-only / ours, {sync} (info)", "-", f"es save {us['es_save']} us", m["es_save_ours"]),
        Row("append-1", f"ours untrust/trusted alternating / raw, {sync} (info)", "-",
            f"ours-alt {us['ours_alt']} us", m["alt_raw"]),
        Row("append-1", f"eventsourcing / ours untrust/trusted alternating, {sync} (info)", "-", "", m["es_alt"]),
        *raw_store_rows("append-1", sync, us["raw_store"] + " us", m["raw_store_raw"], m["ours_raw_store"]),
    ]  # fmt: skip
    return rows, detail


def _payload_len(db: Path) -> float:
    conn = sqlite3.connect(db)
    try:
        return float(
            conn.execute("SELECT avg(length(payload)) FROM events WHERE type = 'TrustedStateRecorded'").fetchone()[0]
        )
    finally:
        conn.close()


def batched(workdir: Path, sync: str, rounds: int, batches: int, size: int = 1000) -> tuple[list[Row], dict[str, Any]]:
    """1,000 events per transaction over 10 streams: store.transaction + tx.append vs executemany."""
    folder = workdir / f"batch-{sync.lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("ours.db", "raw.db", "raw-store.db", "es.db"):
        remove_db(folder / name)
    store = SQLiteEventStore(folder / "ours.db", synchronous=sync)
    raw = Raw(folder / "raw.db", sync)
    raw_store = Raw(folder / "raw-store.db", sync, table="store")
    app = es_app(folder / "es.db", sync)
    per_stream = size // 10
    # each file has its own versions
    gen = {name: Streams(root=str(folder)) for name in ("ours", "raw", "raw_store", "es")}
    ids = [f"batch-c{i:02d}" for i in range(10)]
    es_ids = [app.receive(cid) for cid in ids]

    def make_batch(who: str) -> list[tuple[str, int, list[NewEvent], str]]:
        return [(cid, *gen[who].take(cid, per_stream)) for cid in ids]

    def ours() -> float:
        total = 0.0
        for _ in range(batches):
            batch = make_batch("ours")
            t0 = clock()
            with store.transaction() as tx:
                for cid, expected, events, state in batch:
                    tx.append(stream_of(cid), expected, events, status=state, category="grpo")
            total += clock() - t0
        return total / (batches * size)

    def raw_many(who: str = "raw", into: Raw = raw) -> float:
        total = 0.0
        for _ in range(batches):
            batch = make_batch(who)
            rows = into.rows([(e.stream_id, e.type, e.payload) for _, _, events, _ in batch for e in events])
            total += into.batch(rows)
        return total / (batches * size)

    def raw_store_many() -> float:
        return raw_many("raw_store", raw_store)

    def es() -> float:
        total = 0.0
        for _ in range(batches):
            batch = make_batch("es")
            aggs = [app.repository.get(i) for i in es_ids]
            for agg, (_, _, events, _) in zip(aggs, batch, strict=True):
                for e in events:
                    agg.record(e.type, e.payload)
            t0 = clock()
            app.save(*aggs)
            total += clock() - t0
        return total / (batches * size)

    contenders = {"ours": ours, "raw": raw_many, "es": es, "raw_store": raw_store_many}
    interleaved(contenders, 1)
    times = interleaved(contenders, rounds)
    store.close()
    raw.close()
    raw_store.close()
    app.close()
    ours_raw = per_round_ratio(times["ours"], times["raw"])
    es_ours = per_round_ratio(times["es"], times["ours"])
    floor = per_round_ratio(times["raw_store"], times["raw"])
    ours_floor = per_round_ratio(times["ours"], times["raw_store"])
    us = {k: fmt_spread([x * 1e6 for x in v], 2) for k, v in times.items()}
    detail = {
        "batch": f"{size} events per transaction, 10 streams x {per_stream} (realistic mixed payloads)",
        "batches_per_round": batches,
        "us_per_event": {k: summary(v, 1e6, 2) for k, v in times.items()},
    }
    rows = [
        Row("append-batch", f"ours / raw executemany, {sync}", "<= 1.5x",
            f"ours {us['ours']} us/ev, raw {us['raw']} us/ev", median(ours_raw), median(ours_raw) <= 1.5,
            {"ratio": summary(ours_raw)}),
        Row("append-batch", f"es save(1000) / ours, {sync} (info)", "-", f"es {us['es']} us/ev",
            median(es_ours), None, {"ratio": summary(es_ours)}),
        *raw_store_rows("append-batch", sync, us["raw_store"] + " us/ev", median(floor), median(ours_floor)),
    ]  # fmt: skip
    return rows, detail


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    for sync in ("NORMAL", "FULL"):
        n = (300 if quick else 600) if sync == "NORMAL" else (60 if quick else 150)
        r, d = single(workdir, sync, rounds, n)
        rows += r
        details[f"single_{sync}"] = d
        print(f"  append one-per-tx {sync}: done", flush=True)
    for sync in ("NORMAL", "FULL"):
        r, d = batched(workdir, sync, rounds, 2 if quick else 5)
        rows += r
        details[f"batched_{sync}"] = d
        print(f"  append batched {sync}: done", flush=True)
    return rows, details


if __name__ == "__main__":  # pragma: no cover - manual use
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for row in run(Path(tmp), 3, True)[0]:
            print(row)
    os._exit(0)
