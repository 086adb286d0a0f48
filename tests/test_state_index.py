"""The state index (`streams`) is derived off the commit path: a checkpoint brings it to its state,
a commit never writes it, and `verify` compares it with the fold at the position it reflects."""

from __future__ import annotations

import json
import sqlite3

import pytest
from backends import pg_execute
from conftest import Workspace, cli, hand_off_dpo, invoke

from lifecycle_fsm import Ledger
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.replay import take_checkpoint, verify
from lifecycle_fsm.store.records import StreamHead

CLOCK = "2026-01-01T00:00:00Z"


def _problems(ledger: Ledger) -> list[str]:
    return [p["code"] for p in verify(ledger.store)["problems"]]


def test_a_commit_writes_no_index_row_and_a_checkpoint_writes_the_fold(ws: Workspace) -> None:
    db = hand_off_dpo(ws)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM streams").fetchone() == (0,)
    with Ledger.open(db) as ledger:
        assert _problems(ledger) == []
        # Every stream is listed at its version in the log, unlabelled until a checkpoint.
        assert StreamHead(stream_of("dpo-v5"), 3, None, None) in ledger.store.streams()
        take_checkpoint(ledger.store, clock=lambda: CLOCK)
        assert StreamHead(stream_of("dpo-v5"), 3, "ready", "dpo") in ledger.store.streams()
        assert ledger.store.state_index()[0] == ledger.store.head().seq
        assert _problems(ledger) == []


def test_verify_compares_a_lagging_index_at_its_own_position(ws: Workspace) -> None:
    """Commands after the checkpoint leave the index behind, which is sound; an edited row is not."""
    for args in (("init",), ("baseline", "activate", str(ws.baseline())), ("receive", str(ws.dpo())), ("checkpoint",)):
        assert invoke(ws.db, *args).exit_code == 0, args
    with Ledger.open(ws.db) as ledger:
        position = ledger.store.state_index()[0]
        ledger.check("dpo-v5")  # the candidate moves on past the index
        assert ledger.store.state_index()[0] == position < ledger.store.head().seq
        assert _problems(ledger) == []
        stale = {h.stream_id: h for h in ledger.store.streams()}[stream_of("dpo-v5")]
        assert stale.status is None and stale.version == ledger.candidate("dpo-v5").version
    with sqlite3.connect(ws.db) as conn:  # a hand edit of the index, at the position it reflects
        conn.execute("UPDATE streams SET status = 'reject' WHERE stream_id = ?", (stream_of("dpo-v5"),))
    with Ledger.open(ws.db) as ledger:
        assert _problems(ledger) == ["state_index"]
        assert invoke(ws.db, "replay", "--full").exit_code == 0
        assert ledger.store.state_index()[0] == ledger.store.head().seq
        assert _problems(ledger) == []


def test_an_index_behind_the_latest_checkpoint_or_edited_names_where(ws: Workspace) -> None:
    """Rows removed take the index's position behind the checkpoint that wrote it; an edited row is
    named with what the index and the log each say."""
    db = hand_off_dpo(ws)
    with Ledger.open(db) as ledger:
        take_checkpoint(ledger.store, clock=lambda: CLOCK)
        head = ledger.store.head().seq
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE streams SET status = 'reject' WHERE stream_id = ?", (stream_of("dpo-v5"),))
    with Ledger.open(db) as ledger:
        (found,) = verify(ledger.store)["problems"]
        assert found["reason"].startswith(
            f"state index (streams) differs from a replay to its position {head} at candidate:dpo-v5: "
            "candidate:dpo-v5 is version 3 status reject kind dpo in the index, version 3 status ready kind dpo"
        )
    with sqlite3.connect(db) as conn:  # the row of the stream the head's event is on
        conn.execute("DELETE FROM streams WHERE stream_id = ?", (stream_of("dpo-v5"),))
    with Ledger.open(db) as ledger:
        (found,) = verify(ledger.store)["problems"]
        assert f"reflects position {head - 3}, behind the checkpoint at {head}" in found["reason"], found


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("table", ["streams", "checkpoints", "checkpoint_streams", "event_index"])
def test_a_derived_table_dropped_by_hand_is_made_again_by_replay_full(
    ws: Workspace, request: pytest.FixtureRequest, backend: str, table: str
) -> None:
    """Derived and disposable: a read that needs the table says how to repair it (exit 7, one line), and
    `replay --full` makes it again from the log (a dropped checkpoints table takes its copies with it,
    whose ids come again); checkpoints and commands go on."""
    db = ws.db if backend == "sqlite" else request.getfixturevalue("pg_url")
    for args in (
        ("init",),
        ("baseline", "activate", str(ws.baseline())),
        ("receive", str(ws.dpo())),
        ("check", "dpo-v5"),
    ):
        assert invoke(db, *args).exit_code == 0, args
    for _ in range(3):
        assert invoke(db, "checkpoint").exit_code == 0
    if backend == "sqlite":
        with sqlite3.connect(db) as conn:
            conn.execute(f"DROP TABLE {table}")
    else:
        pg_execute(db, f"DROP TABLE {table} CASCADE")
    if table != "event_index":  # a ledger without it is read as an older ledger's
        refused = cli(db, "verify")
        assert refused.returncode == 7 and refused.stderr.count("\n") == 1, refused.stderr
        missing = f"no such table: {table}" if backend == "sqlite" else f'relation "{table}" does not exist'
        assert missing in refused.stderr and "`lifecycle replay --full` makes it again" in refused.stderr
    assert invoke(db, "replay", "--full").exit_code == 0
    report = json.loads(cli(db, "verify", "--json").stdout)
    codes = [p["code"] for p in report["problems"]]
    assert codes == (["checkpoint"] * 3 if table == "checkpoint_streams" else []), report  # their copies are gone
    for _ in range(3):  # checkpoints go on (new ids meet no copies of the ones that are gone)
        assert invoke(db, "checkpoint").exit_code == 0
    assert invoke(db, "handoff", "dpo-v5").exit_code == 0
    assert [p["code"] for p in json.loads(cli(db, "verify", "--json").stdout)["problems"]] == codes
