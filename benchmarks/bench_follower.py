"""The follower measurement: does a reader polling `seq > last` see every event while 8 processes commit late?

Two designs on the same server, the same load (8 writer processes, each transaction
sleeping 0-3 ms between its insert and its COMMIT): a bare `bigserial` table, where
`seq` is drawn at INSERT and so can commit out of order, and our store, where the
write lock is taken before `seq` is assigned. We count the positions the reader never
saw although they are in the table at the end (LIBRARY_NOTES measured 32% for a bare
sequence; ours must be 0). tests/test_store_concurrency.py asserts ours.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from bench_common import Row

from lifecycle_fsm.store.open import open_store

REPO = Path(__file__).resolve().parent.parent

_BARE = """
import random, sys, time, psycopg
url, me, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(me)
with psycopg.connect(url) as conn:
    for k in range(n):
        conn.execute("INSERT INTO bare (writer, k) VALUES (%s, %s)", (me, k))
        time.sleep(rng.uniform(0, 0.003))
        conn.commit()
"""

_OURS = """
import random, sys, time
from lifecycle_fsm.store import NewEvent
from lifecycle_fsm.store.open import open_store
url, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(me)
store = open_store(url, synchronous="NORMAL")
for k in range(n):
    with store.transaction() as tx:
        tx.append("w" + me, k, [NewEvent("w" + me, "Wrote", 1, {"k": k}, me + "-" + str(k), "t", "w")], fresh_ids=True)
        time.sleep(rng.uniform(0, 0.003))
store.close()
"""


def _run(script: str, url: str, writers: int, n: int, poll: Callable[[int], list[int]]) -> dict[str, Any]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, str(i), str(n)], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for i in range(writers)
    ]
    seen: list[int] = []
    polls = 0
    while any(p.poll() is None for p in procs) or polls == 0:
        seen += poll(seen[-1] if seen else 0)
        polls += 1
        time.sleep(0.0005)
    seen += poll(seen[-1] if seen else 0)
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"writer failed: {err}")
    return {"events": writers * n, "seen": len(set(seen)), "skipped": writers * n - len(set(seen)), "polls": polls}


def follower(fresh_schema: Callable[[str], tuple[str, str]], writers: int, n: int) -> tuple[list[Row], dict[str, Any]]:
    _, bare_url = fresh_schema("bare")
    with psycopg.connect(bare_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bare (seq bigserial PRIMARY KEY, writer int, k int)")

        def bare_poll(last: int) -> list[int]:
            return [r[0] for r in conn.execute("SELECT seq FROM bare WHERE seq > %s ORDER BY seq", (last,))]

        bare = _run(_BARE, bare_url, writers, n, bare_poll)
    _, ours_url = fresh_schema("follow")
    reader = open_store(ours_url, synchronous="NORMAL")
    ours = _run(_OURS, ours_url, writers, n, lambda last: [e.seq for e in reader.select_events(after=last)])
    ok = reader.verify_chain().ok
    reader.close()
    rows = [
        Row("pg-follower", f"bare bigserial: positions a follower skipped, {writers} late committers (info)", "-",
            f"{bare['skipped']} of {bare['events']} skipped ({100 * bare['skipped'] / bare['events']:.0f}%)"),
        Row("pg-follower", f"ours: positions a follower skipped, {writers} late committers", "0",
            f"{ours['skipped']} of {ours['events']} skipped, chain {'ok' if ok else 'BROKEN'}", None,
            ours["skipped"] == 0 and ok),
    ]  # fmt: skip
    return rows, {"bare": bare, "ours": ours}
