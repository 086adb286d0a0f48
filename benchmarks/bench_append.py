"""append: our commands on SQLite against a raw INSERT+COMMIT of the same rows, and against eventsourcing.

At `synchronous=NORMAL` and `FULL`, WAL, each contender on its own file in one folder:
- ours: the public `Ledger` API. "one command" is `record_trusted_state` (a small file
  hashed on disk) round-robin over 100 candidates; "the mix" is seven commands per new
  candidate (`bench_common.mix_commands`);
- raw, plain table: `BEGIN IMMEDIATE; INSERT; COMMIT` per command of copies of the rows
  our warm-up round wrote (same bytes, same grouping into transactions) into a table
  with the same columns, its primary key and the two UNIQUE constraints, nothing else;
- raw, the store's table: the same copies into a file the store created (its indexes
  and triggers): what the schema alone costs;
- eventsourcing: `repository.get` + one command method + `save` per command, carrying
  the same event content (given, not computed: only its persistence is timed).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench_common import (
    ACTOR,
    KIND,
    Copies,
    Row,
    Settings,
    cpu,
    es_contender,
    es_row,
    es_sqlite,
    eventsourcing_missing,
    interleaved,
    mix_commands,
    new_ledger,
    per_round,
    sized,
    spread,
    sqlite_rows,
)

from lifecycle_fsm import Ledger

CANDIDATES = 100
Groups = list[list[tuple[Any, ...]]]


class RawTable:
    """A plain sqlite3 connection inserting copies of our rows, one transaction per command."""

    def __init__(self, path: Path, sync: str, columns: Sequence[tuple[str, str]], *, plain: bool) -> None:
        if not plain:  # the store's own schema, as a new ledger gets it
            Ledger.open(path, synchronous=sync, actor=ACTOR).close()
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={sync}")
        if plain:
            cols = ", ".join(f"{name} {kind} NOT NULL" for name, kind in columns)
            constraints = "PRIMARY KEY (seq), UNIQUE (stream_id, version), UNIQUE (event_id)"
            self.conn.execute(f"CREATE TABLE events ({cols}, {constraints})")
        self.insert = f"INSERT INTO events VALUES ({', '.join('?' * len(columns))})"
        self.copies = Copies([name for name, _ in columns], start_seq=10_000_000)

    def run(self, groups: Groups) -> float:
        """CPU per command for one round: copies made before the clock, then one transaction each."""
        batch = self.copies.next_batch(groups)
        conn, insert = self.conn, self.insert
        t0 = cpu()
        for rows in batch:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, rows)
            conn.execute("COMMIT")
        return (cpu() - t0) / len(batch)


def timed_commands(commands: list[Callable[[], Any]]) -> tuple[float, list[list[int]]]:
    """CPU per command, and the seqs each command appended."""
    t0 = cpu()
    results = [command() for command in commands]
    took = (cpu() - t0) / len(commands)
    return took, [[e.seq for e in result.events] for result in results]


def captured(path: Path, seqs: list[list[int]]) -> tuple[list[tuple[str, str]], Groups]:
    """The rows a round of our commands wrote, grouped by command."""
    columns, rows = sqlite_rows(path, min(s for group in seqs for s in group) - 1)
    by_seq = {row[0]: row for row in rows}
    return columns, [[by_seq[s] for s in group] for group in seqs]


def measure(s: Settings, sync: str, name: str) -> list[Row]:
    """One command ("one") or the mix ("mix") through our Ledger, raw copies of its rows, eventsourcing."""
    ws, low = s.ws, sync.lower()
    folder = s.workdir / f"append-{name}-{low}"
    folder.mkdir(parents=True, exist_ok=True)
    ledger = new_ledger(folder / "ours.db", ws, sync, CANDIDATES)
    files = [ws.trusted[i][KIND] for i in range(CANDIDATES)]
    done = [0]

    def commands() -> list[Callable[[], Any]]:
        done[0] += 1
        if name == "one":
            n = sized(600 if sync == "NORMAL" else 150, s)
            record = ledger.record_trusted_state
            return [partial(record, f"c{i % CANDIDATES:05d}", KIND, files[i % CANDIDATES]) for i in range(n)]
        per = sized(60 if sync == "NORMAL" else 20, s)
        return [c for i in range(per) for c in mix_commands(ledger, ws, i, f"m{done[0]:03d}-{i:05d}")]

    _, seqs = timed_commands(commands())  # the rows the baselines copy
    columns, groups = captured(folder / "ours.db", seqs)
    plain = RawTable(folder / "raw.db", sync, columns, plain=True)
    contenders: dict[str, Callable[[], float]] = {
        "ours": lambda: timed_commands(commands())[0],
        "raw": lambda: plain.run(groups),
    }
    if name == "mix":
        table = RawTable(folder / "raw-store.db", sync, columns, plain=False)
        contenders["store_table"] = lambda: table.run(groups)
    missing = eventsourcing_missing()
    if missing is None:
        app = es_sqlite(folder / "es.db", sync)
        contenders["es"] = es_contender(app, [c for c, _ in columns], groups)
    t = interleaved(contenders, s)
    for closable in [ledger, plain.conn, *([table.conn] if name == "mix" else []), *([app] if missing is None else [])]:
        closable.close()
    what = {"one": "one command / raw INSERT+COMMIT of its row", "mix": "command mix / raw INSERT+COMMIT of its rows"}
    target = {"one": ("<=", 3.0), "mix": ("<=", 4.0)}[name] if sync == "NORMAL" else None
    figures = f"ours {spread(t['ours'])}, raw {spread(t['raw'])} per command"
    rows = [
        Row(
            f"append.{name}.{low}",
            f"{what[name]}, plain table, {sync}",
            "CPU",
            per_round(t["ours"], t["raw"]),
            target,
            figures,
        )
    ]
    if "store_table" in t:
        what_table = f"raw INSERT+COMMIT of the mix's rows, the store's own table / plain table, {sync}"
        ratios = per_round(t["store_table"], t["raw"])
        rows.append(
            Row(
                f"append.table.{low}",
                what_table,
                "CPU",
                ratios,
                ("<=", 1.1),
                f"store's table {spread(t['store_table'])}",
            )
        )
    label = {"one": "one command", "mix": "command mix"}[name]
    return [*rows, es_row(f"append.es_{name}.{low}", f"eventsourcing / ours, {label}, {sync}", "CPU", t, missing)]


def run(s: Settings) -> list[Row]:
    return [row for sync in ("NORMAL", "FULL") for name in ("one", "mix") for row in measure(s, sync, name)]
