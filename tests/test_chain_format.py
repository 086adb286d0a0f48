"""The hash chain is reproducible from the documented formula alone (another tool can check it)."""

from __future__ import annotations

import hashlib
import json
import sqlite3

from conftest import Workspace


def _documented_hash(row: sqlite3.Row) -> str:
    """sha256(prev_hash + "\\n" + header + "\\n" + payload), header = sorted compact JSON."""
    header = {k: row[k] for k in ("actor", "event_id", "recorded_at", "schema_version", "seq", "stream_id", "type")}
    header["version"] = row["version"]
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{row['prev_hash']}\n{text}\n{row['payload']}".encode()).hexdigest()


def test_every_stored_hash_matches_the_documented_byte_stream(ws: Workspace) -> None:
    """Recompute each row's hash with the stdlib only and follow the prev_hash links from 64 zeros."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo(evaluation_version="évaluation-v1"))  # non-ASCII survives as UTF-8
        ledger.check("dpo-v5")
        ledger.hand_off("dpo-v5")
    conn = sqlite3.connect(ws.db)
    conn.row_factory = sqlite3.Row
    previous = "0" * 64
    rows = conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    assert len(rows) == 5
    for row in rows:
        assert row["prev_hash"] == previous
        assert row["hash"] == _documented_hash(row)
        assert json.loads(row["payload"]) is not None
        assert row["payload"] == json.dumps(
            json.loads(row["payload"]), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        previous = row["hash"]
    conn.close()
