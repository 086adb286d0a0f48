"""What `lifecycle serve` shows: a verified snapshot of the ledger, and Datasette metadata for it.

The browser never opens the live file. The copy gains `candidate_states` (each candidate's state after each
of its events, by the replay fold, so no SQL re-implements the machine); Datasette serves it immutable, with
only the canned queries below and read-only table pages.
"""

from __future__ import annotations

import contextlib
import html
import os
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import orjson

from lifecycle_fsm.candidate_events import CANDIDATE_EVENTS
from lifecycle_fsm.errors import CorruptionError, StoreError
from lifecycle_fsm.events import candidate_id_of
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.state import Fold
from lifecycle_fsm.store.base import select_events, verify_chain
from lifecycle_fsm.store.sql import position_at_sql
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.upcasting import decoded_payload

CANNED_QUERIES: dict[str, JSON] = {
    "rejections": {
        "title": "Rejected candidates",
        "description": "Each rejected candidate with its reason codes and the event (seq) that rejected it.",
        "sql": "SELECT id, reason_codes, seq, type, recorded_at, actor FROM candidate_states "
        "WHERE state = 'reject' ORDER BY seq",
    },
    "recoveries": {
        "title": "Recovery plans",
        "description": "Every recovery plan: the failed stage, the action, the trusted state reused, blocking or not.",
        "sql": "SELECT substr(stream_id, 11) AS id, seq, json_extract(payload, '$.stage') AS stage, "
        "json_extract(payload, '$.action') AS action, json_extract(payload, '$.recovery_state') AS recovery_state, "
        "json_extract(payload, '$.reused_state') AS reused_state, json_extract(payload, '$.blocking') AS blocking, "
        "recorded_at, actor FROM events WHERE type = 'RecoveryPlanned' ORDER BY seq",
    },
    "candidate_events": {
        "title": "One candidate's events",
        "description": "Every event of the candidate named by :id, oldest first, with its payload (the evidence).",
        "sql": "SELECT seq, version, type, recorded_at, actor, event_id, payload FROM events "
        "WHERE stream_id = 'candidate:' || :id ORDER BY seq",
        "params": ["id"],
    },
    "ready_at": {
        "title": "Ready at a time",
        "description": "The candidates that were ready at :time (ISO 8601 with Z or an offset, naive = UTC), as "
        "`lifecycle status --as-of` reads it: the log up to the event before the first one recorded after it. A time "
        "that does not parse is refused, saying what is wrong with it, never answered with an empty list.",
        "sql": "WITH at AS (SELECT CASE WHEN lifecycle_utc(:time) IS NULL THEN 0 "  # a blank form: no time yet
        f"ELSE {position_at_sql('lifecycle_utc(:time)')} END AS pos) "
        "SELECT s.id, s.state, s.seq, s.recorded_at FROM candidate_states s, at "
        "WHERE s.seq = (SELECT max(t.seq) FROM candidate_states t WHERE t.id = s.id AND t.seq <= at.pos) "
        "AND s.state = 'ready' ORDER BY s.id",
        "params": ["time"],
    },
    "chain_head": {
        "title": "Head of the chain",
        "description": "The last event's seq and hash (compare with `lifecycle verify --json`) and the event count.",
        "sql": "SELECT seq, hash, recorded_at, (SELECT count(*) FROM events) AS events FROM events "
        "ORDER BY seq DESC LIMIT 1",
    },
    "seals": {
        "title": "Sealed heads",
        "description": "Every HeadSealed event on the seals stream: the seq and hash it signed, and the key.",
        "sql": "SELECT seq, recorded_at, actor, json_extract(payload, '$.seq') AS sealed_seq, "
        "json_extract(payload, '$.hash') AS sealed_hash, json_extract(payload, '$.key_id') AS key_id, "
        "json_extract(payload, '$.signature') AS signature, payload FROM events WHERE stream_id = 'seals' "
        "ORDER BY seq",
    },
}


@attrs.frozen
class Snapshot:
    """A verified copy of a ledger, named after the ledger file's stem."""

    path: Path
    head_seq: int
    head_hash: str

    @property
    def name(self) -> str:
        return self.path.stem


def snapshot(ledger: Path, folder: Path) -> Snapshot:
    """Copy the ledger (backup API: consistent while writers go on) into `folder` as a 0600 file, verify the
    copy's chain and add `candidate_states`."""
    target = folder / f"{ledger.stem}.db"
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        source = contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True))
        with source as reader, contextlib.closing(sqlite3.connect(target)) as copy:
            reader.backup(copy)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{ledger}: cannot take a snapshot ({e})") from e
    with SQLiteEventStore(target, synchronous="OFF") as store:
        chain = verify_chain(store)
        if not chain.ok:
            raise CorruptionError(
                f"the ledger's chain is broken at seq {chain.bad_seq}: {chain.reason}; see `lifecycle verify`",
                seq=chain.bad_seq,
            )
        rows = _states(store)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        with conn:
            conn.execute(
                "CREATE TABLE candidate_states (id TEXT NOT NULL, seq INTEGER PRIMARY KEY, type TEXT NOT NULL, "
                "trigger TEXT NOT NULL, state TEXT NOT NULL, reason_codes TEXT NOT NULL, recorded_at TEXT NOT NULL, "
                "actor TEXT NOT NULL)"
            )
            conn.executemany("INSERT INTO candidate_states VALUES (?,?,?,?,?,?,?,?)", rows)
            conn.execute("CREATE INDEX candidate_states_id ON candidate_states (id, seq)")
        conn.execute("PRAGMA journal_mode=DELETE")  # immutable readers expect no WAL beside the file
    return Snapshot(target, chain.head.seq, chain.head.hash)


def _states(store: SQLiteEventStore) -> list[tuple[Any, ...]]:
    """Each candidate event with the candidate's state and reason codes after it (the replay fold)."""
    folding = Fold()
    rows = []
    for event in select_events(store):
        folding.add((event.seq, event.stream_id, event.version, event.type, event.schema_version, event.payload))
        cid = candidate_id_of(event.stream_id)
        if cid is None:
            continue
        trigger = CANDIDATE_EVENTS[event.type].trigger_for(decoded_payload(event))
        work = folding.work(event.stream_id)
        assert work is not None
        reasons = orjson.dumps(list(work["reason_codes"])).decode()
        rows.append((cid, event.seq, event.type, trigger, str(work["state"]), reasons, event.recorded_at, event.actor))
    return rows


def metadata(snap: Snapshot, database_path: str) -> JSON:
    """Datasette metadata: the title naming the head, the canned queries (listed on the home page too), no SQL.
    `database_path`: the database's URL path (`/<stem>`, as Datasette encodes it)."""
    listed = "".join(
        f'<li><a href="{html.escape(database_path)}/{name}">{html.escape(q["title"])}</a>: '
        f"{html.escape(q['description'])}</li>"
        for name, q in CANNED_QUERIES.items()
    )
    about = (
        f"A read-only snapshot of the ledger taken when the server started: head seq {snap.head_seq}, "
        f"hash {snap.head_hash} (chain verified). Writers keep using the live file; restart to see newer events. "
        "candidate_states is derived by the replay fold for this view; it is not part of the ledger."
    )
    return {
        "title": f"Ledger {snap.name}: snapshot at seq {snap.head_seq}",
        "description_html": f"<p>{html.escape(about)}</p><h2>Queries</h2><ul>{listed}</ul>",
        "allow_sql": False,
        "databases": {
            snap.name: {
                "description": f"The ledger's tables as of seq {snap.head_seq}, and the queries an auditor asks.",
                "queries": CANNED_QUERIES,
                "tables": {
                    "events": {"description": "The append-only, hash-chained log: one row per event."},
                    "candidate_states": {"description": "Each candidate's state after each of its events."},
                },
            }
        },
    }
