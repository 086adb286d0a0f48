"""Reads that fail closed (SPEC §8, issue #9): each attack a file writer can make, and what catches it.

Real SQLite files, edited with plain sqlite3 the way an attacker with write access
would (dropping the append-only triggers first), and the real CLI.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from conftest import Workspace, cli, count_events, hand_off_dpo, invoke, restore_triggers

READ_COMMANDS = [
    ("status",),
    ("status", "dpo-v5"),
    ("history", "dpo-v5"),
    ("explain", "dpo-v5"),
    ("replay",),
    ("verify",),
    ("log",),
]


def _ready_ledger(ws: Workspace) -> Path:
    """A ledger with one candidate handed off (ready) and one more received."""
    return hand_off_dpo(ws)


def _tamper(db: Path, *statements: str) -> None:
    """What someone with write access does: drop the triggers, then edit."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        for trigger in ("events_refuse_update", "events_refuse_delete", "events_refuse_replace"):
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for sql in statements:
            conn.execute(sql)
        restore_triggers(conn)


# --- files that are not ledgers --------------------------------------------------------


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_a_zero_byte_file_is_not_a_ledger_and_a_read_never_initialises_it(ws: Workspace, args: tuple[str, ...]) -> None:
    """Exit 7, one Error line, and the file is still 0 bytes (no schema, no WAL header)."""
    ws.db.write_bytes(b"")
    result = cli(ws.db, *args)
    assert result.returncode == 7, result.stderr
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "not a ledger" in result.stderr
    assert ws.db.stat().st_size == 0


def test_a_non_ledger_sqlite_file_is_refused_and_left_alone(ws: Workspace) -> None:
    """Another program's database: exit 7, no table of ours added to it."""
    with sqlite3.connect(ws.db) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    result = cli(ws.db, "status")
    assert result.returncode == 7 and "not a ledger" in result.stderr
    with sqlite3.connect(ws.db) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["notes"]


@pytest.mark.parametrize("damage", ["DROP TABLE meta", "DELETE FROM meta"])
def test_a_ledger_whose_schema_version_was_removed_is_not_written_to(ws: Workspace, damage: str) -> None:
    """Reads said "not a ledger" (exit 7), but the next write re-created `meta`, stamped the file with
    today's schema and appended (exit 0) on a log nobody could vouch for. Every release wrote the
    version with its first table, so a log without one lost it by hand: exit 7, nothing appended."""
    _ready_ledger(ws)
    before = count_events(ws.db)
    with sqlite3.connect(ws.db) as conn:
        conn.execute(damage)
    for args in (("window", "3"), ("receive", str(ws.dpo("dpo-v6"))), ("status",), ("init",)):
        result = cli(ws.db, *args)
        assert result.returncode == 7, (args, result.stderr)
        assert "not a ledger" in result.stderr and result.stderr.count("\n") == 1
    assert count_events(ws.db) == before
    with sqlite3.connect(ws.db) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'meta'").fetchone()[0] == (
            damage.startswith("DELETE")
        )


@pytest.mark.postgres
@pytest.mark.parametrize("damage", ["DROP TABLE meta", "DELETE FROM meta"])
def test_a_postgres_ledger_whose_schema_version_was_removed_is_not_written_to(
    ws: Workspace, pg_url: str, damage: str
) -> None:
    """The same on PostgreSQL: a dropped `meta` was refused already, an emptied one was re-stamped
    by the next write, which appended."""
    from backends import pg_execute

    assert cli(pg_url, "init").returncode == 0
    pg_execute(pg_url, damage)
    for args in (("window", "3"), ("init",)):
        result = cli(pg_url, *args)
        assert result.returncode == 7, (args, result.stderr)
        assert "not a ledger" in result.stderr and result.stderr.count("\n") == 1
    assert pg_execute(pg_url, "SELECT count(*) FROM events") == [(1,)]


def test_a_text_file_is_not_a_ledger(ws: Workspace) -> None:
    ws.db.write_text("hello, this is not SQLite\n" * 100)
    result = cli(ws.db, "verify")
    assert result.returncode == 7 and result.stderr.startswith("Error: ") and "Traceback" not in result.stderr


def test_init_may_initialise_an_empty_file(ws: Workspace) -> None:
    """Only init makes a ledger of an existing empty file."""
    ws.db.write_bytes(b"")
    assert invoke(ws.db, "init").exit_code == 0
    assert json.loads(invoke(ws.db, "verify", "--json").stdout)["ok"] is True


@pytest.mark.parametrize("args", [("window", "3"), ("evaluation", "activate", "eval-2")], ids=" ".join)
def test_a_write_refuses_an_empty_file(ws: Workspace, args: tuple[str, ...]) -> None:
    """A ledger truncated to nothing does not silently start over on the next write: exit 7, still 0 bytes."""
    ws.db.write_bytes(b"")
    result = cli(ws.db, *args)
    assert result.returncode == 7, result.stderr
    assert result.stderr.startswith("Error: ") and "an empty file, not a ledger" in result.stderr
    assert ws.db.stat().st_size == 0


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
@pytest.mark.parametrize(
    "args",
    [
        ("init",),
        ("status",),
        ("status", "x"),
        ("window", "3"),
        ("log",),
        ("migrate", "DB", "COPY"),
        ("migrate", "SOURCE", "DB"),
    ],
    ids=" ".join,
)
def test_a_folder_a_fifo_or_a_device_is_no_ledger(ws: Workspace, kind: str, args: tuple[str, ...]) -> None:
    """`--db` a FIFO or /dev/null was "an empty file, not a ledger …; `lifecycle init` creates one here", and
    `init` there then failed "disk I/O error"; a folder was "unable to open database file". Each says what it is
    (exit 7) and nothing is created beside it."""
    if kind == "folder":
        db = ws.root / "ledgers"
        db.mkdir()
    elif kind == "fifo":
        db = ws.root / "ledger.fifo"
        os.mkfifo(db)
    else:
        db = Path("/dev/null")
    source = ws.root / "source.db"
    if "SOURCE" in args:
        assert invoke(source, "init").exit_code == 0
    argv = [
        str(db) if a == "DB" else str(source) if a == "SOURCE" else str(ws.root / "copy.db") if a == "COPY" else a
        for a in args
    ]
    before = sorted(p.name for p in ws.root.iterdir())
    result = cli(db, *argv)
    assert (result.returncode, result.stdout) == (7, ""), result.stderr
    what = "a folder, not a ledger file" if kind == "folder" else "not a regular file"
    assert result.stderr.startswith(f"Error: {db}: {what}") and result.stderr.count("\n") == 1, result.stderr
    assert sorted(p.name for p in ws.root.iterdir()) == before


@pytest.mark.parametrize("db", [":memory:", ""])
@pytest.mark.parametrize("args", [("init",), ("status",), ("verify",)], ids=lambda a: a[0])
def test_an_in_memory_database_is_refused(tmp_path: Path, db: str, args: tuple[str, ...]) -> None:
    """Writes to :memory: would be acknowledged and vanish: exit 3 before anything runs."""
    result = cli(db, *args, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("Error: ") and "in-memory" in result.stderr


def test_new_ledger_files_are_private(ws: Workspace) -> None:
    """0600 for the file, its WAL and shared-memory files, whatever the umask allows more."""
    _ready_ledger(ws)
    with sqlite3.connect(ws.db) as reader:  # keeps -wal / -shm alive while we look
        reader.execute("SELECT count(*) FROM events").fetchone()
        for path in (ws.db, Path(f"{ws.db}-wal"), Path(f"{ws.db}-shm")):
            if path.exists():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize("args", [("init",), ("window", "3")], ids=" ".join)
def test_a_new_ledger_made_through_a_dangling_link_is_private(ws: Workspace, args: tuple[str, ...]) -> None:
    """`--db ledger.db` a symlink to a file not made yet (a ledger kept on another disk): the O_EXCL create saw
    the link "exists" and left it to SQLite, which made the target 0644 (world-readable). The target is created
    0600 like every new ledger file."""
    target = ws.root / "disk" / "ledger.db"
    target.parent.mkdir()
    link = ws.root / "ledger.db"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        result = cli(link, *args)
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and target.is_file()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


# --- rows edited in place -----------------------------------------------------------------


@pytest.mark.parametrize("args", READ_COMMANDS[:5], ids=" ".join)
def test_a_row_edited_in_place_is_refused_by_every_read(ws: Workspace, args: tuple[str, ...]) -> None:
    """The forged reason never reaches the reader: exit 6 naming the edited seq."""
    _ready_ledger(ws)
    with sqlite3.connect(ws.db) as conn:
        (seq,) = conn.execute("SELECT seq FROM events WHERE type = 'HandoffDecided'").fetchone()
    _tamper(ws.db, f"UPDATE events SET payload = replace(payload, 'ready_for_evaluation', 'reject') WHERE seq = {seq}")
    result = cli(ws.db, *args)
    assert result.returncode == 6, (args, result.stdout, result.stderr)
    assert f"seq {seq}" in result.stderr and result.stderr.startswith("Error: ")
    assert "reject" not in result.stdout


def test_a_checkpoint_of_a_row_edited_in_place_is_refused_and_nothing_is_sealed(ws: Workspace) -> None:
    """A checkpoint folds each row it snapshots with its own hash checked: a snapshot of the edit would
    make `status` show it (exit 0) from then on, and a signing key would seal the edited chain."""
    _ready_ledger(ws)
    assert cli(ws.db, "key", "new", "--out", str(ws.root / "keys")).returncode == 0
    with sqlite3.connect(ws.db) as conn:
        (seq,) = conn.execute("SELECT seq FROM events WHERE type = 'HandoffDecided'").fetchone()
    _tamper(ws.db, f"UPDATE events SET payload = replace(payload, 'ready_for_evaluation', 'reject') WHERE seq = {seq}")
    events = count_events(ws.db)
    result = cli(ws.db, "--signing-key", str(ws.root / "keys" / "lifecycle-signing.key"), "checkpoint")
    assert result.returncode == 6, (result.stdout, result.stderr)
    assert f"seq {seq}" in result.stderr and result.stderr.count("\n") == 1
    with sqlite3.connect(ws.db) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)
    assert count_events(ws.db) == events
    assert cli(ws.db, "status").returncode == 6


def test_a_seal_over_a_row_edited_since_the_last_seal_is_refused(ws: Workspace) -> None:
    """A key holder never signs a chain edited in place since the last seal: exit 6, nothing appended."""
    _ready_ledger(ws)
    assert cli(ws.db, "key", "new", "--out", str(ws.root / "keys")).returncode == 0
    key = ("--signing-key", str(ws.root / "keys" / "lifecycle-signing.key"))
    assert cli(ws.db, *key, "seal").returncode == 0
    assert cli(ws.db, "receive", str(ws.grpo())).returncode == 0
    _tamper(ws.db, "UPDATE events SET actor = 'mallory' WHERE type = 'CandidateReceived' AND stream_id LIKE '%grpo%'")
    events = count_events(ws.db)
    result = cli(ws.db, *key, "seal")
    assert result.returncode == 6 and "nothing sealed" in result.stderr and result.stderr.count("\n") == 1
    assert count_events(ws.db) == events
    _append_seal_row(ws.db, good=True)  # anyone who may append can add a seal row that seals the head
    assert cli(ws.db, *key, "seal").returncode == 6  # unsigned by this key: it vouches for nothing


def test_a_seal_row_that_does_not_hold_never_blocks_sealing_a_sound_chain(ws: Workspace) -> None:
    _ready_ledger(ws)
    assert cli(ws.db, "key", "new", "--out", str(ws.root / "keys")).returncode == 0
    key = ("--signing-key", str(ws.root / "keys" / "lifecycle-signing.key"))
    assert cli(ws.db, *key, "seal").returncode == 0
    _append_seal_row(ws.db, good=False)
    assert cli(ws.db, "window", "2").returncode == 0
    result = cli(ws.db, *key, "seal")
    assert result.returncode == 0, result.stderr


def _append_seal_row(db: Path, *, good: bool) -> None:
    """A `HeadSealed` appended through the store, as any writer could: sealing the head with its hash
    (`good`) or with a wrong one, under a signature no key made."""
    from lifecycle_fsm.seals import ledger_id_of
    from lifecycle_fsm.store.open import open_store
    from lifecycle_fsm.store.records import NewEvent

    with open_store(db) as store:
        head = store.head()
        payload = {
            "ledger_id": ledger_id_of(store),
            "seq": head.seq,
            "hash": head.hash if good else "0" * 64,
            "key_id": "k",
            "signature": "AAAA",
        }
        row = NewEvent("seals", "HeadSealed", 1, payload, "forged-seal", "2026-12-07T00:00:00.000000Z", "mallory")
        store.append("seals", store.stream_version("seals"), [row])


@pytest.mark.parametrize("column", ["payload", "actor", "recorded_at", "type", "event_id"])
def test_a_column_turned_into_a_blob_is_an_edited_row_not_a_traceback(ws: Workspace, column: str) -> None:
    """`UPDATE events SET payload = CAST(payload AS BLOB)` (the same bytes, another storage class) made every read,
    `verify`, `migrate` and the writes die with "AttributeError: 'bytes' object has no attribute 'encode'" or
    "TypeError: Type is not JSON serializable: bytes" (exit 1). The row's hash cannot hold over a BLOB: it is an
    edited row, exit 6 naming its seq (`verify --json`: `bad_seq`), and a write appends nothing."""
    _ready_ledger(ws)
    with sqlite3.connect(ws.db) as conn:
        (seq,) = conn.execute("SELECT seq FROM events WHERE type = 'ChecksRecorded'").fetchone()
    _tamper(ws.db, f"UPDATE events SET {column} = CAST({column} AS BLOB) WHERE seq = {seq}")
    before = count_events(ws.db)
    for args in [*READ_COMMANDS, ("check", "dpo-v5"), ("window", "9"), ("migrate", str(ws.db), str(ws.root / "c.db"))]:
        result = invoke(ws.db, *args)
        assert result.exit_code == 6, (args, result.output)
        if args != ("verify",):
            assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, (args, result.stderr)
    doc = json.loads(invoke(ws.db, "verify", "--json").stdout)
    assert (doc["ok"], doc["bad_seq"]) == (False, seq)
    assert count_events(ws.db) == before and not (ws.root / "c.db").exists()


@pytest.mark.parametrize(
    "edit",
    [
        "DELETE FROM events WHERE seq = {seq}",
        "UPDATE events SET stream_id = 'candidate:elsewhere' WHERE seq = {seq}",
        "UPDATE events SET stream_id = CAST(stream_id AS BLOB) WHERE seq = {seq}",
    ],
    ids=["deleted", "moved", "blob"],
)
def test_a_row_gone_from_a_candidates_stream_is_refused_not_skipped(ws: Workspace, edit: str) -> None:
    """The rejecting check deleted, or moved to another stream by editing its stream_id (no re-hash needed: the
    row is no longer read), and `history ID` and `log --stream ID` printed the candidate's events without it,
    exit 0: the auditor's list of what happened to a candidate silently lost the decisive event. A stream's
    versions are dense from 1, so the hole shows: exit 6 naming the row after it."""
    _ready_ledger(ws)
    with sqlite3.connect(ws.db) as conn:
        (seq,) = conn.execute("SELECT seq FROM events WHERE type = 'ChecksRecorded'").fetchone()
    _tamper(ws.db, edit.format(seq=seq))
    for args in [
        ("history", "dpo-v5"),
        ("--json", "history", "dpo-v5"),
        ("log", "--stream", "dpo-v5"),
        ("--json", "log", "--stream", "dpo-v5"),
        ("log", "--stream", "dpo-v5", "--before", "99"),
    ]:
        result = invoke(ws.db, *args)
        assert result.exit_code == 6, (args, result.output)
        if args[0] == "--json" or args[0] == "history":  # text `log` streams: the rows before the hole are out
            assert result.stdout == "", (args, result.stdout)
        assert result.stderr.startswith("Error: ") and f"seq {seq + 1}" in result.stderr, (args, result.stderr)
        assert "version 2 is missing" in result.stderr, result.stderr
    assert invoke(ws.db, "log", "--stream", "dpo-v5", "--after", str(seq)).exit_code == 0  # a slice past the hole


def test_explain_refuses_an_edited_decisive_row(ws: Workspace) -> None:
    """The issue's case: a forged check reason printed with exit 0 before; now exit 6."""
    _ready_ledger(ws)
    _tamper(ws.db, "UPDATE events SET payload = replace(payload, 'true', 'false') WHERE type = 'ChecksRecorded'")
    result = cli(ws.db, "explain", "dpo-v5", "--json")
    assert result.returncode == 6 and result.stdout == ""


# --- the state index --------------------------------------------------------------------------


def test_verify_catches_an_edited_state_index(ws: Workspace) -> None:
    """streams.status of a ready candidate edited to reject: verify fails, names the stream."""
    _ready_ledger(ws)
    assert invoke(ws.db, "checkpoint").exit_code == 0  # the state index is written at a checkpoint
    _tamper(ws.db, "UPDATE streams SET status = 'reject' WHERE stream_id = 'candidate:dpo-v5'")
    result = cli(ws.db, "verify", "--json")
    assert result.returncode == 6
    report = json.loads(result.stdout)
    assert report["ok"] is False and "state index" in report["reason"] and "candidate:dpo-v5" in report["reason"]
    assert invoke(ws.db, "replay", "--full").exit_code == 0  # the documented repair
    assert json.loads(invoke(ws.db, "verify", "--json").stdout)["ok"] is True


def test_a_missing_index_row_is_caught(ws: Workspace) -> None:
    """The index is never behind the latest checkpoint: a row removed shows, even the newest stream's."""
    _ready_ledger(ws)
    assert invoke(ws.db, "checkpoint").exit_code == 0
    _tamper(ws.db, "DELETE FROM streams WHERE stream_id = 'candidate:dpo-v5'")
    assert cli(ws.db, "verify").returncode == 6


def test_a_baseline_change_invalidates_a_ready_candidate_whose_index_row_was_edited(ws: Workspace) -> None:
    """The fan-out decides from the fold, not the index: no candidate keeps stale evidence."""
    _ready_ledger(ws)
    assert invoke(ws.db, "checkpoint").exit_code == 0
    _tamper(ws.db, "UPDATE streams SET status = 'reject' WHERE stream_id = 'candidate:dpo-v5'")
    before = count_events(ws.db)
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline("sft2"))).exit_code == 0
    assert count_events(ws.db) == before + 2  # BaselineActivated + EvidenceInvalidated
    doc = json.loads(invoke(ws.db, "status", "dpo-v5", "--json").stdout)
    assert doc["state"] == "received"
