"""`run.py --profile`: cProfile of each hot path, as shares of its total time.

For each path we print the functions with the largest own time (tottime) and the
largest inclusive time (cumtime), as a share of the whole profiled run, so a missed
target can be traced to the function that costs it. cProfile roughly doubles the cost
of small Python calls: read shares, not absolute times.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_append import KIND, N_CANDIDATES, cid_of, seed_candidates, tiny_files
from bench_common import ACTOR, Streams, extend_ledger, remove_db

from lifecycle_fsm.events import stream_of
from lifecycle_fsm.ledger import Ledger
from replay import load_state
from store.sqlite import SQLiteEventStore


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

    if big_db is None or not big_db.exists():
        big_db = folder / "big.db"
        remove_db(big_db)
        with SQLiteEventStore(big_db, synchronous="NORMAL") as s:
            extend_ledger(s, Streams(), [f"grpo-v7-c{i:04d}" for i in range(1000)], 100_000)
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
