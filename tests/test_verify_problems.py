"""`verify` lists every problem it found, and a pinned head's verdict is never hidden behind another.

A tail dropped below a pinned head with the state index left as it was: the index differs from
a full replay (a problem whose usual repair is a rebuild) and the pinned head is missing. Both are
listed, the pinned head first, and no rebuild is advised: a rebuild would make the cut log look whole.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import Workspace, cli, hand_off_dpo, restore_triggers


def _decided(ws: Workspace) -> Path:
    return hand_off_dpo(ws)


def test_a_dropped_tail_with_a_stale_index_reports_the_pinned_head_and_advises_no_rebuild(ws: Workspace) -> None:
    db = _decided(ws)
    assert cli(db, "replay", "--full").returncode == 0  # the state index, at the head
    head = json.loads(cli(db, "verify", "--json").stdout)["head"]
    pin = f"{head['seq']}:{head['hash']}"
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER IF EXISTS events_refuse_delete")
        conn.execute("DELETE FROM events WHERE seq = ?", (head["seq"],))  # the hand-off; the index still says ready
        restore_triggers(conn)
    plain = cli(db, "verify", "--json")
    assert plain.returncode == 6 and "rebuild" in plain.stdout  # without a pin, the index is all there is to fix
    done = cli(db, "verify", "--json", "--expect-head", pin)
    report = json.loads(done.stdout)
    assert done.returncode == 6 and report["ok"] is False
    assert [p["code"] for p in report["problems"]] == ["head_mismatch", "state_index", "event_index"]
    assert (report["reason"], report["bad_seq"]) == ("head_mismatch", head["seq"])
    assert "rebuild" not in done.stdout and "replay --full" not in done.stdout
    text = cli(db, "verify", "--expect-head", pin)
    lines = text.stdout.splitlines()
    assert text.returncode == 6 and len(lines) == 3 and "rebuild" not in text.stdout
    assert lines[0].startswith(f"BROKEN at seq {head['seq']}: head_mismatch") and "state index" in lines[1]
    assert "event index" in lines[2]


def test_a_sound_ledger_has_no_problems(ws: Workspace) -> None:
    report = json.loads(cli(_decided(ws), "verify", "--json").stdout)
    assert report["ok"] is True and report["problems"] == [] and "reason" not in report


def test_a_dropped_guard_is_listed_beside_the_row_edited_behind_it(ws: Workspace) -> None:
    """The tamperer's two steps are two findings: the chain broken at the edited row and the append-only
    trigger gone (the guard was only looked at once the chain held)."""
    db = _decided(ws)
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 3")
    done = cli(db, "verify", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 6 and [p["code"] for p in report["problems"]] == ["chain", "append_only_guard"]
    assert "advice" not in report["problems"][1]  # migrate refuses a broken chain: no repair to advise
    assert report["bad_seq"] == 3 and "stored hash does not match" in report["reason"]
