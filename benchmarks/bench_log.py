"""The auditor's filtered log on a big ledger: each filter with and without the filter indexes.

One ledger file of N events (the replay benchmark's realistic streams), plus 1,000
candidates at the very end that are rejected for `artifact` by a second actor, so a
reason, actor or type filter must find rows far from the start. The same file is
measured twice: with the store's filter indexes (schema 2) and with them dropped (a
copy, as a version 1 file would be without them). `select_matching` is timed in
process, reading every row it returns; the ratio is without / with.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from bench_common import Row, Streams, extend_ledger, fmt_spread, interleaved, median, per_round_ratio

from lifecycle_fsm.events import ChecksRecorded, stream_of
from lifecycle_fsm.replay.log import log_filter
from lifecycle_fsm.store.records import EventFilter, NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.store.sqlite_schema import FILTER_INDEXES

REJECTED = 1000
AUDITOR = "auditor@ci"


def _rejections(store: SQLiteEventStore, streams: Streams) -> None:
    """1,000 new candidates, each received and rejected for `artifact`, by another actor."""
    with store.transaction() as tx:
        for n in range(REJECTED):
            cid = f"rejected-{n}"
            received = streams._received(cid, 0)
            evidence = streams._evidence(cid, 0)
            evidence["artifact"] = {**evidence["artifact"], "actual": "0" * 64, "verified": False}
            check = ChecksRecorded(passed=False, reason_codes=["artifact"], **evidence)
            stamp = streams.clock()
            events = [NewEvent(stream_of(cid), e.TYPE, e.SCHEMA_VERSION, e.to_payload(), uuid.uuid4().hex, stamp,
                               AUDITOR) for e in (received, check)]  # fmt: skip
            tx.append(stream_of(cid), 0, events, status="reject", category="grpo")


def build(path: Path, events: int) -> dict[str, Any]:
    """The big ledger; returns the filter values the queries use (a time window in the middle)."""
    streams = Streams()
    with SQLiteEventStore(path, synchronous="OFF") as store:
        ids = [f"cand-{i:05d}" for i in range(2000)]
        extend_ledger(store, streams, ids, events)
        _rejections(store, streams)
        middle = store.event_at(events // 2)
        assert middle is not None
        later = store.event_at(events // 2 + 1000)
        assert later is not None
    return {"since": middle.recorded_at, "until": later.recorded_at, "stream": ids[7]}


QUERIES: dict[str, dict[str, Any]] = {
    "type HandoffDecided, first 20": {"types": ("HandoffDecided",), "limit": 20},
    "type RecoveryPlanned, all": {"types": ("RecoveryPlanned",)},
    "actor (1,000 rejections at the end)": {"actor": AUDITOR},
    "since/until (1,000 events in the middle)": {"since": "{since}", "until": "{until}"},
    "stream (one candidate)": {"stream": "{stream}"},
    "reason artifact (1,000 at the end)": {"reason": "artifact"},
    "reason artifact, first 20": {"reason": "artifact", "limit": 20},
}


def _query(spec: dict[str, Any], values: dict[str, Any]) -> EventFilter:
    args = {k: (v.format(**values) if isinstance(v, str) else v) for k, v in spec.items()}
    return log_filter(**args)


def _timed(path: Path, query: EventFilter) -> float:
    store = SQLiteEventStore(path, synchronous="NORMAL")
    try:
        start = time.perf_counter()
        count = sum(1 for _ in store.select_matching(query))
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    assert count >= 0
    return elapsed


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    events = 100_000 if quick else 1_000_000
    indexed = workdir / "log-indexed.db"
    values = build(indexed, events)
    bare = workdir / "log-no-filter-indexes.db"
    shutil.copy(indexed, bare)
    with sqlite3.connect(bare) as conn:
        for statement in FILTER_INDEXES:
            conn.execute("DROP INDEX " + statement.split(" IF NOT EXISTS ")[1].split(" ON ")[0])
    rows: list[Row] = []
    detail: dict[str, Any] = {"events": events + 2 * REJECTED, "queries": {}}
    for name, spec in QUERIES.items():
        query = _query(spec, values)
        with SQLiteEventStore(indexed, synchronous="NORMAL") as store:
            found = sum(1 for _ in store.select_matching(query))
        times = interleaved({"with": lambda q=query: _timed(indexed, q), "without": lambda q=query: _timed(bare, q)},
                            rounds)  # fmt: skip
        ratios = per_round_ratio(times["without"], times["with"])
        detail["queries"][name] = {"rows": found, "with_s": times["with"], "without_s": times["without"]}
        with_ms = fmt_spread([t * 1e3 for t in times["with"]], 1)
        without_ms = fmt_spread([t * 1e3 for t in times["without"]], 1)
        rows.append(Row("log", f"{name}: {found} rows", "without/with indexes",
                        f"with {with_ms} ms; without {without_ms} ms", median(ratios)))  # fmt: skip
    return rows, detail
