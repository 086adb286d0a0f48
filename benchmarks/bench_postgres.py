"""PostgreSQL: append (single, batched), replay, writers and the follower, beside raw psycopg and eventsourcing.

The server is `LIFECYCLE_BENCH_PG` (else `LIFECYCLE_TEST_PG`, else
postgresql://postgres@127.0.0.1:5432/test); every contender gets a fresh schema.
Commits are fsync-bound, so the single-append figures are taken with
`synchronous_commit` off and on.

SPEC §9's "single append <= 1.5x / <= 1.2x a raw INSERT+COMMIT of the same row" is read as
the store's append of that one event row (the coordinator's decision, issue #11): the
target rows time `store.append` of one event, one transaction, through the public store
API, its `NewEvent` built before the clock as raw's row is. Contenders:
- store: `store.append(stream, version, [event], fresh_ids=True)`: canonical JSON, the
  chain hash, the advisory lock, the head read and version guard, the insert, the stream
  index, NOTIFY and the commit are on the clock;
- raw: psycopg's default transaction (BEGIN, `INSERT` of the same row with its values
  computed up front, hashes and seq included, then `COMMIT`: 3 round trips) into the
  store's own table (`store.postgres_schema.DDL`, run whole: the same columns, CHECKs,
  PRIMARY KEY, UNIQUE(event_id), UNIQUE(stream_id, version), the three filter indexes and
  the update/delete-refusing triggers, which an INSERT never fires). What raw lacks, and
  a user storing this row would need for our guarantees: the lock that orders writers
  (raw's seq is a client counter: two writers would collide), the head read and chain
  hash, the expected-version guard, the stream index, the follower's NOTIFY;
- raw bare (info): the same into a table with only the PRIMARY KEY and the two UNIQUEs;
- ours (info): the whole command, `Ledger.record_trusted_state` on the PostgreSQL store
  (as bench_append does on SQLite: it also hashes a file on disk, folds, builds events);
- eventsourcing 9.x, `eventsourcing.postgres`: the documented command (`repository.get`
  with the aggregate cache on, the command method, `save`), one event per save, compared
  with our command (targets 2x off, 1.5x on).
The follower row counts the positions a reader polling `seq > last` never saw while 8
processes commit late, for a bare `bigserial` table vs ours (SPEC §9's proof).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import bench_append
import orjson
import psycopg
from bench_append import KIND, N_CANDIDATES, RAW_SCHEMA, _es_classes, cid_of, seed_candidates, tiny_files
from bench_common import ACTOR, Clock, Row, Streams, clock, fmt_spread, interleaved, median, per_round_ratio, summary
from bench_follower import follower
from bench_writers import writers_bench

from lifecycle_fsm.events import TrustedStateRecorded, stream_of
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import load_state
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.postgres_schema import DDL
from lifecycle_fsm.store.records import NewEvent

BASE = os.environ.get("LIFECYCLE_BENCH_PG") or os.environ.get(
    "LIFECYCLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"
)
RAW_INSERT = "INSERT INTO events VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
SYNC = {"NORMAL": "off", "FULL": "on"}  # our synchronous setting -> synchronous_commit


_CREATED: set[str] = set()  # this process's schemas: other sessions' benchmarks share the server


def fresh_schema(tag: str) -> tuple[str, str]:
    """A new empty schema and a URL whose search_path is it."""
    schema = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _CREATED.add(schema)
    sep = "&" if "?" in BASE else "?"
    return schema, f"{BASE}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def drop_schemas(prefix: str = "bench_") -> None:
    """Drop the schemas this process made (never another benchmark's, running beside it)."""
    with psycopg.connect(BASE, autocommit=True) as conn:
        for name in sorted(n for n in _CREATED if n.startswith(prefix)):
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            _CREATED.discard(name)


@contextlib.contextmanager
def pgoptions(sync: str) -> Iterator[None]:
    """libpq's PGOPTIONS for connections that eventsourcing's pool opens in this phase."""
    old = os.environ.get("PGOPTIONS")
    os.environ["PGOPTIONS"] = f"-c synchronous_commit={SYNC[sync]}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PGOPTIONS", None)
        else:
            os.environ["PGOPTIONS"] = old


class RawPg:
    """Plain psycopg: the floor we compare against.

    `table="store"` inserts into the store's own `events` table (`store.postgres_schema.DDL`,
    run whole: the same columns, CHECKs, PRIMARY KEY, UNIQUEs, filter indexes and triggers);
    `table="bare"` into one with only the PRIMARY KEY and the two UNIQUEs.
    """

    def __init__(self, url: str, sync: str, table: str = "store") -> None:
        self.conn = psycopg.connect(url)
        self.conn.execute("SELECT set_config('synchronous_commit', %s, false)", (SYNC[sync],))
        for statement in DDL if table == "store" else [RAW_SCHEMA.replace("INTEGER PRIMARY KEY", "BIGINT PRIMARY KEY")]:
            self.conn.execute(statement)
        self.conn.commit()
        self.seq = 0
        self.versions: dict[str, int] = {}
        self.clock = Clock()

    def rows(self, payloads: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
        out = []
        for stream, type_name, payload in payloads:
            self.seq += 1
            version = self.versions[stream] = self.versions.get(stream, 0) + 1
            out.append((self.seq, stream, version, uuid.uuid4().hex, type_name, 1, canonical_json(payload),
                        self.clock(), ACTOR, f"{self.seq - 1:064x}", f"{self.seq:064x}"))  # fmt: skip
        return out

    def one_per_tx(self, rows: list[tuple[Any, ...]]) -> float:
        conn = self.conn
        t0 = clock()
        for row in rows:
            conn.execute(RAW_INSERT, row)
            conn.commit()
        return clock() - t0

    def batch(self, rows: list[tuple[Any, ...]]) -> float:
        t0 = clock()
        with self.conn.cursor() as cur:
            cur.executemany(RAW_INSERT, rows)
        self.conn.commit()
        return clock() - t0

    def close(self) -> None:
        self.conn.close()


def es_app(sync: str) -> Any:
    """An eventsourcing Application on PostgreSQL (its own schema), commits at `synchronous_commit`."""
    schema, _ = fresh_schema("es")
    info = psycopg.conninfo.conninfo_to_dict(BASE)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": str(info.get("dbname", "test")),
        "POSTGRES_HOST": str(info.get("host", "127.0.0.1")), "POSTGRES_PORT": str(info.get("port", "5432")),
        "POSTGRES_USER": str(info.get("user", "postgres")), "POSTGRES_PASSWORD": str(info.get("password", "")),
        "POSTGRES_SCHEMA": schema, "AGGREGATE_CACHE_MAXSIZE": "1000",
    }  # fmt: skip
    if bench_append._ES is None:  # one set of aggregate classes per process: eventsourcing registers topics
        bench_append._ES = _es_classes()
    app = bench_append._ES[0](env=env)
    with app.recorder.datastore.get_connection() as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    app.bench_synchronous = next(iter(row.values())) if isinstance(row, dict) else row[0]
    return app


def single(sync: str, rounds: int, n: int, folder: Path) -> tuple[list[Row], dict[str, Any]]:
    """One event per transaction: store.append vs raw psycopg (targets); our command vs raw and eventsourcing."""
    files = tiny_files(folder)
    ids = [cid_of(i) for i in range(N_CANDIDATES)]
    ledger = Ledger.open(fresh_schema("ours")[1], synchronous=sync, actor=ACTOR)
    seed_candidates(ledger.store, ids)  # type: ignore[arg-type]
    store = open_store(fresh_schema("store")[1], synchronous=sync)
    versions = dict.fromkeys(ids, 0)
    raw = RawPg(fresh_schema("raw")[1], sync, table="store")
    bare = RawPg(fresh_schema("rawbare")[1], sync, table="bare")
    with pgoptions(sync):
        app = es_app(sync)
        es_ids = [app.receive(cid) for cid in ids]
    shas = [f"{i:064x}" for i in range(N_CANDIDATES)]
    events = [TrustedStateRecorded(KIND, files[j], shas[j]) for j in range(N_CANDIDATES)]

    def ours() -> float:
        t0 = clock()
        for i in range(n):
            ledger.record_trusted_state(ids[i % N_CANDIDATES], KIND, files[i % N_CANDIDATES])
        return (clock() - t0) / n

    def store_one() -> float:
        # The events are built before the clock, as raw's rows are: timed is the store's append of
        # one event (canonical JSON, the chain, the lock, the guarded insert, the index, the commit).
        clock_ = Clock()
        batch = []
        for i in range(n):
            cid = ids[i % N_CANDIDATES]
            payload = events[i % N_CANDIDATES].to_payload()
            batch.append((cid, NewEvent(cid, TrustedStateRecorded.TYPE, 1, payload, uuid.uuid4().hex, clock_(), ACTOR)))
        t0 = clock()
        for cid, event in batch:
            store.append(cid, versions[cid], [event], fresh_ids=True)
            versions[cid] += 1
        return (clock() - t0) / n

    def raw_rows(table: RawPg) -> list[tuple[Any, ...]]:
        ev = [(stream_of(ids[i % N_CANDIDATES]), TrustedStateRecorded.TYPE, events[i % N_CANDIDATES].to_payload())
              for i in range(n)]  # fmt: skip
        return table.rows(ev)

    def es() -> float:
        t0 = clock()
        for i in range(n):
            j = i % N_CANDIDATES
            app.record_trusted_state(es_ids[j], KIND, files[j], shas[j])
        return (clock() - t0) / n

    contenders = {"ours": ours, "store": store_one, "raw": lambda: raw.one_per_tx(raw_rows(raw)) / n,
                  "raw_bare": lambda: bare.one_per_tx(raw_rows(bare)) / n, "es": es}  # fmt: skip
    with pgoptions(sync):
        interleaved(contenders, 1)
        times = interleaved(contenders, rounds)
    for closable in (ledger, store, raw, bare, app):
        closable.close()
    pairs = {"store_raw": ("store", "raw"), "ours_raw": ("ours", "raw"), "es_ours": ("es", "ours"),
             "store_bare": ("store", "raw_bare")}  # fmt: skip
    r = {k: per_round_ratio(times[a], times[b]) for k, (a, b) in pairs.items()}
    m = {k: median(v) for k, v in r.items()}
    us = {k: fmt_spread([x * 1e6 for x in v], 1) for k, v in times.items()}
    limit, es_limit = (1.5, 2.0) if sync == "NORMAL" else (1.2, 1.5)
    sc = f"synchronous_commit={SYNC[sync]}"
    rows = [
        Row("pg-append-1", f"store.append / raw psycopg INSERT+COMMIT, one event, {sc}", f"<= {limit}x",
            f"store {us['store']} us, raw {us['raw']} us", m["store_raw"], m["store_raw"] <= limit),
        Row("pg-append-1", f"eventsourcing / ours (command), {sc}", f">= {es_limit}x", f"es get+save {us['es']} us",
            m["es_ours"], m["es_ours"] >= es_limit),
        Row("pg-append-1", f"ours (command: record_trusted_state) / raw, {sc} (info)", "-", f"ours {us['ours']} us",
            m["ours_raw"]),
        Row("pg-append-1", f"store.append / raw into a bare table (PK + 2 UNIQUE), {sc} (info)", "-",
            f"raw bare {us['raw_bare']} us", m["store_bare"]),
    ]  # fmt: skip
    detail = {"ops_per_round": n, "es_synchronous_commit": app.bench_synchronous,
              "us_per_op": {k: summary(v, 1e6, 1) for k, v in times.items()},
              "ratios": {k: summary(v) for k, v in r.items()}}  # fmt: skip
    return rows, detail


def batched(sync: str, rounds: int, batches: int, size: int = 1000) -> tuple[list[Row], dict[str, Any]]:
    """1,000 events per transaction over 10 streams: store.transaction + tx.append vs executemany."""
    store = open_store(fresh_schema("batch")[1], synchronous=sync)
    raw = RawPg(fresh_schema("rawbatch")[1], sync)
    gen = {name: Streams() for name in ("ours", "raw")}
    ids = [f"batch-c{i:02d}" for i in range(10)]

    def ours() -> float:
        total = 0.0
        for _ in range(batches):
            batch = [(cid, *gen["ours"].take(cid, size // 10)) for cid in ids]
            t0 = clock()
            with store.transaction() as tx:
                for cid, expected, events, state in batch:
                    tx.append(stream_of(cid), expected, events, status=state, category="grpo", fresh_ids=True)
            total += clock() - t0
        return total / (batches * size)

    def raw_many() -> float:
        total = 0.0
        for _ in range(batches):
            batch = [(cid, *gen["raw"].take(cid, size // 10)) for cid in ids]
            total += raw.batch(raw.rows([(e.stream_id, e.type, e.payload) for _, _, evs, _ in batch for e in evs]))
        return total / (batches * size)

    interleaved({"ours": ours, "raw": raw_many}, 1)
    times = interleaved({"ours": ours, "raw": raw_many}, rounds)
    store.close()
    raw.close()
    ratio = per_round_ratio(times["ours"], times["raw"])
    us = {k: fmt_spread([x * 1e6 for x in v], 2) for k, v in times.items()}
    name = f"ours / raw executemany, synchronous_commit={SYNC[sync]} (info)"
    measured = f"ours {us['ours']} us/ev, raw {us['raw']} us/ev"
    row = Row("pg-append-batch", name, "-", measured, median(ratio), None, {"ratio": summary(ratio)})
    return [row], {"us_per_event": {k: summary(v, 1e6, 2) for k, v in times.items()}}


def replay(rounds: int, events: int, folder: Path) -> tuple[list[Row], dict[str, Any]]:
    """A full fold of the same ledger on PostgreSQL and on SQLite, and a plain SELECT + decode on PostgreSQL."""
    url = fresh_schema("replay")[1]
    stores = {
        "pg": open_store(url, synchronous="NORMAL"),
        "sqlite": open_store(folder / "replay.db", synchronous="NORMAL"),
    }
    for store in stores.values():
        gen = Streams()
        with store.transaction() as tx:
            expected, evs = gen.ledger_events()
            tx.append("ledger", expected, evs)
        done = 0
        while done < events:
            with store.transaction() as tx:
                for k in range(50):
                    cid = f"r-c{(done // 1000 + k) % 200:03d}"
                    expected, evs, state = gen.take(cid, 20)
                    tx.append(stream_of(cid), expected, evs, status=state, category="grpo", fresh_ids=True)
                    done += len(evs)
    n = stores["pg"].count_events()
    conn = psycopg.connect(url)

    def fold(name: str) -> float:
        t0 = clock()
        load_state(stores[name], use_checkpoints=False)
        return (clock() - t0) / n

    def raw() -> float:
        t0 = clock()
        with conn.cursor() as cur:
            cur.execute("SELECT seq, stream_id, version, type, schema_version, payload FROM events ORDER BY seq")
            for row in cur:
                orjson.loads(row[5])
        conn.rollback()
        return (clock() - t0) / n

    contenders = {"pg": lambda: fold("pg"), "sqlite": lambda: fold("sqlite"), "raw": raw}
    times = interleaved(contenders, rounds)
    for store in stores.values():
        store.close()
    conn.close()
    us = {k: fmt_spread([x * 1e6 for x in v], 2) for k, v in times.items()}
    ratio = per_round_ratio(times["pg"], times["sqlite"])
    raw_ratio = per_round_ratio(times["pg"], times["raw"])
    rows = [
        Row("pg-replay", f"full fold of {n:,} events, PostgreSQL / SQLite (info)", "-",
            f"pg {us['pg']} us/ev, sqlite {us['sqlite']} us/ev", median(ratio)),
        Row("pg-replay", "full fold / plain SELECT + orjson decode, PostgreSQL (info)", "-",
            f"select+decode {us['raw']} us/ev", median(raw_ratio)),
    ]  # fmt: skip
    return rows, {"events": n, "us_per_event": {k: summary(v, 1e6, 2) for k, v in times.items()}}


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    folder = workdir / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for sync in ("NORMAL", "FULL"):
            r, d = single(sync, rounds, 300 if quick else 600, folder)
            rows += r
            details[f"single_{sync}"] = d
            print(f"  pg append one-per-tx {sync}: done", flush=True)
        for sync in ("NORMAL", "FULL"):
            r, d = batched(sync, rounds, 2 if quick else 5)
            rows += r
            details[f"batched_{sync}"] = d
        print("  pg append batched: done", flush=True)
        r, details["replay"] = replay(rounds, 20_000 if quick else 100_000, folder)
        rows += r
        print("  pg replay: done", flush=True)
        for sync in ("NORMAL", "FULL"):
            r, details[f"writers_{sync}"] = writers_bench(
                folder, sync, rounds, 50 if quick else 100, target=fresh_schema("writers")[1], label="-pg", writers=8
            )
            rows += r
        print("  pg writers: done", flush=True)
        r, details["follower"] = follower(fresh_schema, 8, 60 if quick else 150)
        rows += r
        print("  pg follower: done", flush=True)
    finally:
        drop_schemas()
    return rows, details
