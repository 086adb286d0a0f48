"""postgres: one command on PostgreSQL against raw psycopg and against eventsourcing.

With `synchronous_commit` off (our `synchronous=NORMAL`) and on (`FULL`), each contender
in its own schema:
- ours: `Ledger.record_trusted_state` round-robin over 100 candidates (public API);
- raw: psycopg's default transaction per command (`INSERT` of a copy of the row our
  warm-up wrote, then `COMMIT`) into a table with the same columns, its primary key and
  the two UNIQUE constraints (`CREATE TABLE ... (LIKE events)`);
- eventsourcing, `eventsourcing.postgres`: `repository.get` + a command method + `save`,
  recording the same event content.
CPU time is this process's plus that of the server processes serving its connections
(the server runs on this machine: /proc/PID/schedstat): much of a command's work is the
server's, and with `synchronous_commit=on` wall time is mostly the wait for a flush.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from bench_common import (
    KIND,
    Copies,
    Row,
    Settings,
    cpu,
    es_app,
    es_contender,
    es_row,
    eventsourcing_missing,
    interleaved,
    new_ledger,
    per_round,
    pg_schema,
    sized,
    spread,
)

CANDIDATES = 100
SYNCHRONOUS_COMMIT = {"NORMAL": "off", "FULL": "on"}


def _local_ports() -> set[int]:
    """The local TCP ports of this process's sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class ServerCpu:
    """CPU seconds the server processes serving this process's connections have used so far."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def __call__(self) -> float:
        ports = _local_ports()
        total = 0.0
        for pid, port in self.conn.execute("SELECT pid, client_port FROM pg_stat_activity"):
            if port in ports:
                try:
                    total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
                except OSError:
                    continue
        return total


@contextmanager
def libpq_env(sync: str) -> Iterator[None]:
    """`synchronous_commit` for the connections eventsourcing's pool opens (libpq reads PGOPTIONS)."""
    old = os.environ.get("PGOPTIONS")
    os.environ["PGOPTIONS"] = f"-c synchronous_commit={SYNCHRONOUS_COMMIT[sync]}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PGOPTIONS", None)
        else:
            os.environ["PGOPTIONS"] = old


def es_postgres(base: str) -> Any:
    schema, _ = pg_schema(base, "es")
    info = psycopg.conninfo.conninfo_to_dict(base)
    return es_app(
        {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": str(info.get("dbname", "postgres")),
            "POSTGRES_HOST": str(info.get("host", "127.0.0.1")),
            "POSTGRES_PORT": str(info.get("port", "5432")),
            "POSTGRES_USER": str(info.get("user", "postgres")),
            "POSTGRES_PASSWORD": str(info.get("password", "")),
            "POSTGRES_SCHEMA": schema,
        }
    )


def one_command(s: Settings, sync: str, server: ServerCpu) -> list[Row]:
    n = sized(400, s)
    ours_schema, url = pg_schema(s.pg_url, "ours")
    ledger = new_ledger(url, s.ws, sync, CANDIDATES)
    files = [s.ws.trusted[i][KIND] for i in range(CANDIDATES)]

    def ours() -> list[int]:
        record = ledger.record_trusted_state
        return [e.seq for i in range(n) for e in record(f"c{i % CANDIDATES:05d}", KIND, files[i % CANDIDATES]).events]

    seqs = ours()  # the rows raw copies
    raw = psycopg.connect(pg_schema(s.pg_url, "raw")[1])
    raw.execute("SELECT set_config('synchronous_commit', %s, false)", (SYNCHRONOUS_COMMIT[sync],))
    raw.execute(f"CREATE TABLE events (LIKE {ours_schema}.events)")
    raw.execute("ALTER TABLE events ADD PRIMARY KEY (seq), ADD UNIQUE (stream_id, version), ADD UNIQUE (event_id)")
    cur = raw.execute(f"SELECT * FROM {ours_schema}.events WHERE seq >= %s ORDER BY seq", (min(seqs),))
    columns = [d.name for d in cur.description or []]
    groups = [[row] for row in cur.fetchall()]
    raw.commit()
    copies = Copies(columns, start_seq=0)
    insert = f"INSERT INTO events VALUES ({', '.join(['%s'] * len(columns))})"

    def raw_round() -> None:
        for (row,) in copies.next_batch(groups):
            raw.execute(insert, row)
            raw.commit()

    contenders: dict[str, Callable[[], Any]] = {"ours": ours, "raw": raw_round}
    missing = eventsourcing_missing()
    if missing is None:
        with libpq_env(sync):
            app = es_postgres(s.pg_url)
            es = es_contender(app, columns, groups)

        def es_round() -> None:
            with libpq_env(sync):  # a connection the pool opens now gets the setting too
                es()

        contenders["es"] = es_round

    def timed(work: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            before = server()
            t0 = cpu()
            work()
            took = cpu() - t0
            return (took + server() - before) / n

        return run

    t = interleaved({name: timed(work) for name, work in contenders.items()}, s)
    ledger.close()
    raw.close()
    if missing is None:
        app.close()
    setting = f"synchronous_commit={SYNCHRONOUS_COMMIT[sync]}"
    clock = "CPU, client + server"
    return [
        Row(
            f"postgres.one.{SYNCHRONOUS_COMMIT[sync]}",
            f"one command / raw psycopg INSERT+COMMIT of its row, plain table, {setting}",
            clock,
            per_round(t["ours"], t["raw"]),
            None,
            f"ours {spread(t['ours'])}, raw {spread(t['raw'])}",
        ),
        es_row(
            f"postgres.es_one.{SYNCHRONOUS_COMMIT[sync]}",
            f"eventsourcing / ours, one command, {setting}",
            clock,
            t,
            missing,
        ),
    ]


def run(s: Settings) -> list[Row]:
    server = ServerCpu(s.pg_url)
    try:
        return [row for sync in ("NORMAL", "FULL") for row in one_command(s, sync, server)]
    finally:
        server.conn.close()
