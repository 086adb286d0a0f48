"""`run.py --profile`: where the time goes on each hot path.

Two views. `breakdown()` times the parts of each path directly (no profiler): the
file hash, our SQL statements replayed by hand, canonical JSON, the chain hash, the
INSERT with and without the replace trigger, the fold's apply step on decoded
payloads. `profile_all()` runs cProfile and prints the functions with the largest own
and inclusive time as shares of the run. cProfile inflates many small Python calls
(recursive helpers most of all): trust the breakdown for sizes, cProfile for names.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import re
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from bench_append import KIND, N_CANDIDATES, cid_of, seed_candidates, tiny_files
from bench_common import ACTOR, Streams, clock, extend_ledger, remove_db

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.events import CANDIDATE_PREFIX, stream_of
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import load_state
from lifecycle_fsm.state import apply_candidate
from lifecycle_fsm.store.chain import canonical_json, event_hash
from lifecycle_fsm.store.sqlite import EVENT_COLUMNS, SQLiteEventStore
from lifecycle_fsm.store.sqlite_schema import SCHEMA
from lifecycle_fsm.store.sqlite_transaction import _UPSERT_STREAM, _insert_sql, _versions_sql

_INSERT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"


def _label(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    parts = Path(filename).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else filename
    return f"{short}:{line}({name})"


def _shares(prof: cProfile.Profile, top: int) -> dict[str, Any]:
    stats = pstats.Stats(prof)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1e-9
    rows = [(func, v[1], v[2], v[3]) for func, v in raw.items()]
    own = sorted(rows, key=lambda r: r[2], reverse=True)[:top]
    inclusive = sorted(rows, key=lambda r: r[3], reverse=True)[: top + 6]
    return {
        "total_s": round(total, 3),
        "own": [{"function": _label(f), "calls": n, "share": round(t / total, 3)} for f, n, t, _ in own],
        "inclusive": [{"function": _label(f), "calls": n, "share": round(c / total, 3)} for f, n, _, c in inclusive],
    }


def _profile(fn: Callable[[], object], top: int) -> dict[str, Any]:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return _shares(prof, top)


def ensure_big(workdir: Path, big_db: Path | None) -> Path:
    """The replay section's ledger if it ran, else a 100k-event one built here."""
    if big_db is not None and big_db.exists():
        return big_db
    path = workdir / "profile-big.db"
    if not path.exists():
        with SQLiteEventStore(path, synchronous="NORMAL") as s:
            extend_ledger(s, Streams(), [f"grpo-v7-c{i:04d}" for i in range(500)], 100_000)
    return path


def profile_all(workdir: Path, big_db: Path | None, top: int = 14) -> dict[str, Any]:
    """Profile the single-command path, a 1,000-event batch, a full fold and verify_chain."""
    folder = workdir / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    files = tiny_files(folder)
    ids = [cid_of(i) for i in range(N_CANDIDATES)]
    out: dict[str, Any] = {}

    remove_db(folder / "single.db")
    ledger = Ledger.open(folder / "single.db", synchronous="NORMAL", actor=ACTOR)
    seed_candidates(ledger.store, ids)

    def commands() -> None:
        for i in range(3000):
            ledger.record_trusted_state(ids[i % N_CANDIDATES], KIND, files[i % N_CANDIDATES])

    out["single command (record_trusted_state, NORMAL)"] = _profile(commands, top)
    ledger.close()

    remove_db(folder / "batch.db")
    store = SQLiteEventStore(folder / "batch.db", synchronous="NORMAL")
    streams = Streams(root=str(folder))
    batches = [[(f"b{j}", *streams.take(f"b{j}", 100)) for j in range(10)] for _ in range(10)]

    def batch() -> None:
        for b in batches:
            with store.transaction() as tx:
                for cid, expected, events, state in b:
                    tx.append(stream_of(cid), expected, events, status=state, category="grpo")

    out["batched append (10 x 1,000 events)"] = _profile(batch, top)
    store.close()

    big_db = ensure_big(workdir, big_db)
    with SQLiteEventStore(big_db, synchronous="NORMAL") as s:
        out[f"fold (load_state, no checkpoints, {s.count_events():,} events)"] = _profile(
            lambda: load_state(s, use_checkpoints=False), top
        )
        out["verify_chain"] = _profile(s.verify_chain, top)
    return out


def print_profiles(profiles: dict[str, Any]) -> None:
    for name, doc in profiles.items():
        print(f"\n== profile: {name} (total {doc['total_s']} s under cProfile)")
        print("   own time share                                   | inclusive share")
        own, inc = doc["own"], doc["inclusive"]
        for i in range(max(len(own), len(inc))):
            left = f"{own[i]['share']:6.1%} {own[i]['function'][:44]:<44}" if i < len(own) else " " * 51
            right = f"{inc[i]['share']:6.1%} {inc[i]['function'][:60]}" if i < len(inc) else ""
            print(f"   {left} | {right}")


def _per(n: int, fn: Callable[[], object]) -> float:
    """Best of 5 runs of `fn`, in microseconds per item (n items per run)."""
    best = float("inf")
    for _ in range(5):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return round(best / n * 1e6, 2)


def _our_sql(conn: sqlite3.Connection, ids: list[str], row: list[Any], n: int) -> None:
    """The statements one record_trusted_state command runs (its state cached: no stream read),
    by hand, with the same values and the store's own statement texts (`_same_statements`
    checks the list against what the store runs)."""
    read, insert = _versions_sql(True, False, 0), _insert_sql(1)  # a command's new event id: no look-up
    for k in range(n):
        stream = stream_of(ids[k % len(ids)])
        conn.execute("BEGIN IMMEDIATE")
        version, seq, _ = conn.execute(read, (stream,)).fetchone()
        conn.execute(insert, (seq + 1, stream, version + 1, uuid.uuid4().hex, *row[4:]))
        conn.execute(_UPSERT_STREAM, (stream, version + 1, "received", "grpo"))
        conn.execute("COMMIT")


def _shapes(run: Callable[[], object], conn: sqlite3.Connection) -> list[str]:
    """The statements `run` sends on `conn`, their values blanked (the trace shows them expanded).

    A statement whose trigger fires is traced once more per trigger: counted once.
    """
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        run()
    finally:
        conn.set_trace_callback(None)
    shapes = [re.sub(r"'(?:[^']|'')*'|\b\d+\b", "?", text) for text in seen]
    return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1] or not s.startswith("INSERT INTO events")]


def _same_statements(ledger: Ledger, ids: list[str], files: list[str], row: list[Any]) -> list[str]:
    """Where `_our_sql` and one real command differ (empty: the same statements in the same order)."""
    conn = ledger.store._conn  # type: ignore[attr-defined]
    ledger.record_trusted_state(ids[0], KIND, files[0])  # after a read the next write restores a pragma
    real = _shapes(lambda: ledger.record_trusted_state(ids[0], KIND, files[0]), conn)
    by_hand = _shapes(lambda: _our_sql(conn, ids, row, 1), conn)
    return [] if real == by_hand else [f"store: {real}", f"by hand: {by_hand}"]


def _insert_rate(path: Path, rows: list[tuple[Any, ...]], *, trigger: bool) -> float:
    remove_db(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statement in SCHEMA:
        if trigger or "refuse_replace" not in statement:
            conn.execute(statement)
    t0 = clock()
    for k in range(0, len(rows), 1000):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_INSERT, rows[k : k + 1000])
        conn.execute("COMMIT")
    elapsed = clock() - t0
    conn.close()
    return round(elapsed / len(rows) * 1e6, 2)


def _hash_all(events: list[Any], texts: list[str]) -> None:
    for i, e in enumerate(events):
        event_hash(
            prev_hash="0" * 64, seq=i, stream_id=e.stream_id, version=1, event_id=e.event_id, type=e.type,
            schema_version=1, payload=texts[i], recorded_at=e.recorded_at, actor=e.actor,
        )  # fmt: skip


def breakdown(workdir: Path, big_db: Path | None) -> dict[str, Any]:
    """Direct timings of the parts of each hot path (NORMAL), in microseconds."""
    folder = workdir / "breakdown"
    folder.mkdir(parents=True, exist_ok=True)
    files = tiny_files(folder)
    ids = [cid_of(i) for i in range(N_CANDIDATES)]
    out: dict[str, Any] = {}

    remove_db(folder / "cmd.db")
    with Ledger.open(folder / "cmd.db", synchronous="NORMAL", actor=ACTOR) as ledger:
        seed_candidates(ledger.store, ids)
        n = 1000

        def commands() -> None:
            for i in range(n):
                ledger.record_trusted_state(ids[i % N_CANDIDATES], KIND, files[i % N_CANDIDATES])

        total = _per(n, commands)
        hashing = _per(n, lambda: [hash_directory(os.path.abspath(files[i % N_CANDIDATES])) for i in range(n)])
        realpath = _per(n, lambda: [os.path.realpath(files[i % N_CANDIDATES]) for i in range(n)])  # for scale
        store = ledger.store
        last = store.event_at(store.head().seq)
        assert last is not None
        row = [last.seq, last.stream_id, last.version, last.event_id, last.type, last.schema_version,
               last.payload, last.recorded_at, last.actor, last.prev_hash, last.hash]  # fmt: skip
        drift = _same_statements(ledger, ids, files, row)
        sql = _per(n, lambda: _our_sql(store._conn, ids, row, n))  # type: ignore[attr-defined]
    out["single command us (record_trusted_state)"] = {
        "total": total, "hash_directory": hashing, "os.path.realpath (for scale)": realpath,
        "our SQL statements by hand (BEGIN, version+head read, INSERT, stream index, COMMIT)": sql,
        "python rest": round(total - hashing - sql, 2),
        **({"WARNING: by-hand statements differ from the store's": drift} if drift else {}),
    }  # fmt: skip

    remove_db(folder / "batch.db")
    streams = Streams(root=str(folder))
    batches = [[(f"b{j}", *streams.take(f"b{j}", 100)) for j in range(10)] for _ in range(10)]
    events = [e for b in batches for _, _, evs, _ in b for e in evs]
    with SQLiteEventStore(folder / "batch.db", synchronous="NORMAL") as store:
        t0 = clock()
        for b in batches:
            with store.transaction() as tx:
                for cid, expected, evs, state in b:
                    tx.append(stream_of(cid), expected, evs, status=state, category="grpo")
        total = round((clock() - t0) / len(events) * 1e6, 2)
        rows = list(store._conn.execute(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY seq"))
    texts = [canonical_json(e.payload) for e in events]
    dumps_only = _per(len(events), lambda: [orjson.dumps(e.payload, option=orjson.OPT_SORT_KEYS) for e in events])
    out["batched append us/event (1,000 per transaction)"] = {
        "total": total,
        "canonical_json": _per(len(events), lambda: [canonical_json(e.payload) for e in events]),
        "of which orjson.dumps": dumps_only,
        "event_hash": _per(len(events), lambda: _hash_all(events, texts)),
        "executemany, our schema": _insert_rate(folder / "ins1.db", rows, trigger=True),
        "executemany, our schema without events_refuse_replace": _insert_rate(folder / "ins2.db", rows, trigger=False),
    }
    doc = out["batched append us/event (1,000 per transaction)"]
    doc["python rest"] = round(total - doc["canonical_json"] - doc["event_hash"] - doc["executemany, our schema"], 2)

    with SQLiteEventStore(ensure_big(workdir, big_db), synchronous="NORMAL") as s:
        n = s.count_events()
        decoded = [
            (r[0], r[1], r[2], r[3], orjson.loads(r[5])) for rows in s.select_fold_batches(to=200_000) for r in rows
        ]

        def apply_all() -> None:
            states: dict[str, Any] = {}
            for seq, stream, version, type_name, payload in decoded:
                if stream.startswith(CANDIDATE_PREFIX):  # not the ledger's or the seals' stream
                    states[stream] = apply_candidate(
                        states.get(stream), type_name, payload, seq=seq, stream_id=stream, version=version
                    )

        out["fold us/event"] = {
            "events": n,
            "load_state(use_checkpoints=False)": _per(n, lambda: load_state(s, use_checkpoints=False)),
            "select_fold_batches iteration only": _per(
                n, lambda: sum(1 for rows in s.select_fold_batches() for _ in rows)
            ),
            "apply_candidate on decoded payloads": _per(len(decoded), apply_all),
        }
    return out


def print_breakdown(doc: dict[str, Any]) -> None:
    print("\n== breakdown (direct timings, best of 5, synchronous=NORMAL)")
    for name, parts in doc.items():
        print(f"   {name}: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
