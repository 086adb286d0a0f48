"""`lifecycle migrate SRC DST` and `store.migrate`: every pair of backends, resume, refusal, a broken source."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backends import BACKEND_NAMES, Backend, make_backend
from conftest import Workspace, cli, restore_triggers, run_cli
from test_store_contract import new

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.store import ConflictError, EventStore, IntegrityError, NewEvent
from lifecycle_fsm.store.base import select_events, verify_chain
from lifecycle_fsm.store.chain import canonical_json, event_hash
from lifecycle_fsm.store.migrate import migrate

PAIRS = [(a, b) for a in BACKEND_NAMES for b in BACKEND_NAMES if a != b]


def _fill(store: EventStore, ws: Workspace) -> None:
    """A real ledger: settings, three candidates, decisions, two checkpoints (one per stream copy)."""
    ledger = Ledger(store, actor="migrate-test")
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    ledger.receive(ws.grpo())
    ledger.check("dpo-v5")
    take_checkpoint(store, clock=utc_now)
    ledger.hand_off("dpo-v5")
    ledger.receive(ws.dpo("dpo-x", source_policy_version="old"))
    ledger.check("dpo-x")
    take_checkpoint(store, clock=utc_now)


def _open_pair(request: pytest.FixtureRequest, tmp_path: Path, pair: tuple[str, str]) -> tuple[Backend, Backend]:
    src_dir, dst_dir = tmp_path / "src", tmp_path / "dst"
    src_dir.mkdir()
    dst_dir.mkdir()
    return make_backend(pair[0], request, src_dir), make_backend(pair[1], request, dst_dir)


@pytest.mark.parametrize(
    "pair", [pytest.param(p, id="->".join(p), marks=[pytest.mark.postgres] if "postgres" in p else []) for p in PAIRS]
)
def test_every_pair_of_backends_copies_everything(
    request: pytest.FixtureRequest, tmp_path: Path, ws: Workspace, pair: tuple[str, str]
) -> None:
    """Events (byte-identical rows), checkpoints with their stream copies, and the derived index all arrive."""
    src_backend, dst_backend = _open_pair(request, tmp_path, pair)
    src, dst = src_backend.open(), dst_backend.open()
    try:
        _fill(src, ws)
        report = migrate(src, dst, index=lambda s: src.streams())
        assert (report.copied, report.already_present, report.checkpoints) == (src.count_events(), 0, 2)
        assert list(select_events(dst)) == list(select_events(src))
        assert verify_chain(dst) == verify_chain(src)
        assert dst.streams() == src.streams()
        for a, b in zip(src.select_checkpoints(), dst.select_checkpoints(), strict=True):
            assert (a.position, a.head_hash, a.snapshot_sha256) == (b.position, b.head_hash, b.snapshot_sha256)
            assert [s.state for s in src.stream_snapshots(a.checkpoint_id)] == [
                s.state for s in dst.stream_snapshots(b.checkpoint_id)
            ]
        again = migrate(src, dst)  # identical: nothing to do
        assert (again.copied, again.checkpoints, again.checkpoints_present) == (0, 0, 2)
    finally:
        src.close()
        dst.close()


@pytest.mark.parametrize(
    "pair", [pytest.param(p, id="->".join(p), marks=[pytest.mark.postgres] if "postgres" in p else []) for p in PAIRS]
)
def test_a_log_whose_times_go_back_is_copied_with_its_times(
    request: pytest.FixtureRequest, tmp_path: Path, pair: tuple[str, str]
) -> None:
    """A ledger written before times were stamped after the head's (a later seq with an earlier time) copies
    as it is: the copy keeps each stored time, so every row and hash is the source's."""
    src_backend, dst_backend = _open_pair(request, tmp_path, pair)
    src, dst = src_backend.open(), dst_backend.open()
    try:
        with src.transaction() as tx:
            for n, second in enumerate((6, 4, 5)):
                event = NewEvent(f"c:{n}", "Checked", 1, {"n": n}, f"e{n}", f"2026-01-01T00:00:0{second}.000000Z", "a")
                tx.append(f"c:{n}", 0, [event], copied=True)
        assert [e.recorded_at[17:19] for e in select_events(src)] == ["06", "04", "05"]
        assert migrate(src, dst).copied == 3
        assert list(select_events(dst)) == list(select_events(src))
        assert verify_chain(dst).ok
    finally:
        src.close()
        dst.close()


def test_a_prefix_resumes_and_anything_else_is_refused(tmp_path: Path) -> None:
    """A destination holding the source's first events gets the rest; a diverging one is refused untouched."""
    src = make_backend("sqlite", None, tmp_path).open()  # type: ignore[arg-type]
    dst = Backend("memory", None).open()
    other = Backend("memory", None).open()
    src.append("a", 0, [new("a", i) for i in range(3)])
    migrate(src, dst)
    src.append("b", 0, [new("b", 0), new("b", 1)])
    report = migrate(src, dst, batch=1)
    assert (report.copied, report.already_present, report.head) == (2, 3, src.head())
    other.append("a", 0, [new("a", 0), new("a", 9)])
    with pytest.raises(ConflictError, match="not a prefix"):
        migrate(src, other)
    assert other.count_events() == 2
    src.close()


def test_a_destination_ahead_of_its_source_is_told_apart_from_a_diverging_one(tmp_path: Path) -> None:
    """A destination that grew after a copy (the source is *its* prefix) was refused as "not a prefix ... its
    head hash is not the source's at seq N", a seq the source does not have: it now says the destination is
    ahead and that copying the other way brings the source up to date; a diverging one still says it diverged."""
    src = Backend("memory", None).open()
    dst = Backend("memory", None).open()
    src.append("a", 0, [new("a", i) for i in range(3)])
    migrate(src, dst)
    dst.append("a", 3, [new("a", 3)])
    with pytest.raises(ConflictError) as info:
        migrate(src, dst)
    assert "the destination is ahead of the source" in str(info.value) and "4 events" in str(info.value)
    assert "the source is a prefix of it" in str(info.value) and "copy the other way" in str(info.value)
    assert "is not the source's at seq 4" not in str(info.value)
    assert dst.count_events() == 4
    other = Backend("memory", None).open()
    other.append("a", 0, [new("a", 0), new("a", 9), new("a", 2), new("a", 3)])
    with pytest.raises(ConflictError, match="not a prefix") as info:
        migrate(src, other)
    assert "ahead" not in str(info.value)
    assert migrate(dst, src).copied == 1  # the way the message says


def test_an_empty_source_copies_nothing_and_a_broken_destination_is_refused(tmp_path: Path) -> None:
    """An empty ledger migrates to nothing (head 0 either side); a destination whose own chain does not hold
    is refused before a row is added to it, though its head is the source's."""
    empty, dst = Backend("memory", None).open(), Backend("memory", None).open()
    done = migrate(empty, dst)
    assert (done.copied, done.head.seq, dst.count_events()) == (0, 0, 0)
    src = Backend("memory", None).open()
    src.append("a", 0, [new("a", i) for i in range(4)])
    backend = make_backend("sqlite", None, tmp_path)  # type: ignore[arg-type]
    prefix = backend.open()
    migrate(src, prefix)
    src.append("a", 4, [new("a", 4)])
    backend.tamper(2, "actor", "mallory")
    with pytest.raises(IntegrityError, match="the destination's chain is broken at seq 2"):
        migrate(src, prefix)
    assert prefix.count_events() == 4
    prefix.close()


def test_a_damaged_checkpoint_is_left_behind_and_said(tmp_path: Path) -> None:
    """A snapshot that no longer matches its own sha256 is not copied (the log does not need it): the copy
    goes on and reports it; the sound checkpoint arrives."""
    backend = make_backend("sqlite", None, tmp_path)  # type: ignore[arg-type]
    src = backend.open()
    src.append("a", 0, [new("a", i) for i in range(4)])
    for position in (2, 4):
        src.append_checkpoint(position=position, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    import sqlite3

    with sqlite3.connect(str(backend.target)) as conn:
        conn.execute("UPDATE checkpoints SET snapshot = '{\"x\":1}' WHERE position = 2")
    dst = Backend("memory", None).open()
    done = migrate(src, dst)
    assert done.checkpoints == 1 and [c.position for c in dst.select_checkpoints()] == [4]
    assert [why for _, why in done.skipped_checkpoints] == ["its snapshot does not match its sha256"]
    src.close()


def test_a_broken_source_stops_the_copy_at_the_break(tmp_path: Path) -> None:
    """An edited source row is an IntegrityError naming its seq; nothing from its batch on is copied."""
    backend = make_backend("sqlite", None, tmp_path)  # type: ignore[arg-type]
    src = backend.open()
    src.append("a", 0, [new("a", i) for i in range(6)])
    src.append_checkpoint(position=2, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    backend.tamper(5, "payload", '{"n":666}')
    dst = Backend("memory", None).open()
    with pytest.raises(IntegrityError, match="seq 5") as info:
        migrate(src, dst, batch=2)
    assert info.value.seq == 5 and dst.head().seq == 4
    assert str(info.value).endswith("; copied seq 1 to 4 (4 events, each verified), nothing after seq 4")
    with pytest.raises(IntegrityError) as again:  # resumed: the first four are there, nothing more can be
        migrate(src, dst, batch=2)
    assert str(again.value).endswith("; nothing was copied (the destination still holds its first 4 events)")
    with pytest.raises(IntegrityError) as whole:  # the break inside the first batch: not "nothing after it"
        migrate(src, Backend("memory", None).open())
    assert str(whole.value).endswith(": stored hash does not match the event's content; nothing was copied")
    src.close()


@pytest.mark.postgres
def test_a_connection_lost_mid_copy_says_what_was_kept(pg_url: str) -> None:
    """A destination whose server session ends mid-copy kept its committed batches, but the error said only
    "nothing of this transaction was committed": it now also says which seqs were copied, and the same
    copy again resumes after them."""
    from backends import PG_BASE, pg_execute

    from lifecycle_fsm.store import StoreError
    from lifecycle_fsm.store.postgres import PostgresEventStore

    src = Backend("memory", None).open()
    src.append("a", 0, [new("a", i) for i in range(6)])
    with PostgresEventStore(pg_url) as dst:

        def cut(done: int, _total: int) -> None:
            if done == 3:  # seq 1-2 are committed; the next batch meets a dead session
                pid = dst.session.conn.info.backend_pid
                pg_execute(PG_BASE, "SELECT pg_terminate_backend(%s)", (pid,))

        with pytest.raises(StoreError) as info:
            migrate(src, dst, batch=2, progress=cut)
        assert "\n" not in str(info.value)
        assert str(info.value).endswith(
            "; copied seq 1 to 2 (2 events, each verified), nothing after seq 2; the same copy again resumes it"
        )
        assert dst.head().seq == 2
        assert migrate(src, dst).copied == 4


def test_migrate_command_from_a_broken_source_says_what_it_copied(ws: Workspace, tmp_path: Path) -> None:
    """Broken at seq 4: exit 6, "nothing was copied" (it said "nothing after it copied"), and no empty DST left.

    A DST that existed before the command is never removed, even left empty.
    """
    src = make_backend("sqlite", None, tmp_path)  # type: ignore[arg-type]
    with Ledger(src.open()) as ledger:  # a ledger's events: the copy folds them as it goes
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.check("dpo-v5")
    src.tamper(4, "actor", "mallory")
    fresh, existing = tmp_path / "fresh.db", tmp_path / "existing.db"
    existing.touch()
    for dst in (fresh, existing):
        done = cli(ws.db, "migrate", str(src.target), str(dst))
        assert (done.returncode, done.stdout) == (6, ""), done.stderr
        assert done.stderr == (
            "Error: the source's chain is broken at seq 4: stored hash does not match the event's content; "
            "nothing was copied\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("fresh", "existing"))) == ["existing.db"]


def test_a_source_with_a_move_the_machine_forbids_is_not_copied_past_it(ws: Workspace, tmp_path: Path) -> None:
    """A correctly chained event no command could append (a received candidate `recovered`) stops the copy
    before it, as a hash break does: exit 6 naming the seq, and nothing after it in DST."""
    from lifecycle_fsm.candidate_events import RecoveryCompleted
    from lifecycle_fsm.events import stream_of

    with Ledger.open(ws.db) as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        forged = RecoveryCompleted("update", "restore_pre_update_checkpoint")
        payload = forged.to_payload()
        row = NewEvent(stream_of("dpo-v5"), forged.TYPE, forged.SCHEMA_VERSION, payload, "x", utc_now(), "m")
        bad = ledger.store.append(stream_of("dpo-v5"), 1, [row]).events[0].seq
        ledger.receive(ws.grpo())
    dst = tmp_path / "copy.db"
    done = cli(tmp_path / "unused.db", "migrate", str(ws.db), str(dst))
    assert done.returncode == 6 and f"seq {bad}" in done.stderr and "nothing was copied" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not dst.exists()


# --- the command, as users run it ----------------------------------------------------------------


def _json(done: Any) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.postgres
def test_migrate_command_sqlite_to_postgres_and_back(ws: Workspace, pg_url: str, tmp_path: Path) -> None:
    """File → PostgreSQL → file: verify --json gives the identical head on all three; status agrees; resume works."""
    with ws.ledger() as led:
        _fill(led.store, ws)
    first = _json(run_cli(ws.db, "--json", "migrate", str(ws.db), pg_url))  # the wiring, as a real process
    assert (first["copied"], first["checkpoints"], first["already_present"]) == (first["head"]["seq"], 2, 0)
    assert first["destination"] == pg_url.replace("%3D", "=")  # the URL as given, without a password
    back = tmp_path / "back.db"
    _json(cli(ws.db, "--json", "migrate", pg_url, str(back)))
    heads = [_json(cli(db, "--json", "verify"))["head"] for db in (str(ws.db), pg_url, str(back))]
    assert heads[0] == heads[1] == heads[2]
    statuses = [_json(cli(db, "--json", "status")) for db in (str(ws.db), pg_url)]
    assert statuses[0] == statuses[1]
    again = cli(ws.db, "migrate", str(ws.db), pg_url)
    assert again.returncode == 0 and "copied 0 events" in again.stdout, again.stderr
    with ws.ledger() as led:
        led.receive(ws.rlvr())
    resumed = _json(cli(ws.db, "--json", "migrate", str(ws.db), pg_url))
    assert (resumed["copied"], resumed["already_present"]) == (1, first["head"]["seq"])
    assert _json(cli(pg_url, "--json", "status", "rlvr-v1"))["state"] == "received"


def test_migrate_command_refusals(ws: Workspace, tmp_path: Path) -> None:
    """A missing source (3), the same ledger twice (3), a diverging destination (5): one Error line, nothing written."""
    with ws.ledger() as led:
        led.init()
    other = tmp_path / "other.db"
    with Ledger.open(other, synchronous="NORMAL") as led:
        led.init(max_window_age=5)
    cases = [
        (["migrate", str(tmp_path / "nope.db"), str(tmp_path / "new.db")], 3, "no ledger"),
        (["migrate", str(ws.db), str(ws.db)], 3, "same ledger"),
        (["migrate", str(ws.db), str(other)], 5, "not a prefix"),
    ]
    for args, code, message in cases:
        done = cli(ws.db, *args)
        assert (done.returncode, done.stdout) == (code, ""), done.stderr
        assert done.stderr.startswith("Error: ") and message in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize("dst", [":memory:", "", "file::memory:?cache=shared"])
def test_migrate_into_memory_is_refused(ws: Workspace, dst: str) -> None:
    """The copy would answer "copied N" and vanish with the command (README: `:memory:` is refused)."""
    with Ledger.open(ws.db, actor="t") as ledger:
        ledger.init()
    done = cli(ws.db, "migrate", str(ws.db), dst)
    assert done.returncode == 3 and "in-memory database" in done.stderr and "DST" in done.stderr, done.stderr


def _edited_under_its_checkpoints(ws: Workspace, edit: Callable[[sqlite3.Connection, int], None]) -> int:
    """A real ledger (`_fill`, checkpoints up to its head) edited behind the store's back by `edit(conn,
    head)`, the append-only triggers put back after; the head before the edit."""
    with Ledger.open(ws.db) as ledger:
        _fill(ledger.store, ws)
        head = ledger.store.head().seq
    with sqlite3.connect(ws.db, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("DROP TRIGGER events_refuse_delete")
        edit(conn, head)
        restore_triggers(conn)
    return head


def _refused_copy(ws: Workspace, tmp_path: Path) -> str:
    """`migrate` of the edited ledger: refused (exit 6, one line) with nothing written; its message."""
    done = cli(tmp_path / "unused", "migrate", str(ws.db), str(tmp_path / "copy.db"))
    assert done.returncode == 6 and done.stderr.count("\n") == 1, done.stderr
    assert "nothing was copied" in done.stderr and not (tmp_path / "copy.db").exists()
    return done.stderr


def test_a_log_rewritten_under_a_checkpoint_is_not_copied(ws: Workspace, tmp_path: Path) -> None:
    """The head event rewritten with its hash recomputed leaves a sound chain; the latest checkpoint's head
    hash is the only trace. The copy is refused before anything is written: a destination re-chained from
    the rewritten rows would verify clean."""

    def rewrite(conn: sqlite3.Connection, head: int) -> None:
        cols = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, prev_hash"
        found = conn.execute(f"SELECT {cols} FROM events WHERE seq = ?", (head,)).fetchone()
        row = dict(zip(cols.split(", "), found, strict=True))
        row["payload"] = canonical_json({**json.loads(row["payload"]), "reason_codes": ["artifact"]})
        conn.execute("UPDATE events SET payload = ?, hash = ? WHERE seq = ?", (row["payload"], event_hash(**row), head))

    head = _edited_under_its_checkpoints(ws, rewrite)
    with Ledger.open(ws.db) as ledger:
        assert verify_chain(ledger.store).ok  # the chain alone holds
    assert f"at seq {head}, but the log has" in _refused_copy(ws, tmp_path)


def test_a_log_cut_below_a_checkpoint_is_not_copied(ws: Workspace, tmp_path: Path) -> None:
    """The tail removed from under the latest checkpoint: the chain that is left holds, the checkpoint past
    the head is the only trace, and the copy is refused before anything is written."""
    head = _edited_under_its_checkpoints(
        ws, lambda conn, head: conn.execute("DELETE FROM events WHERE seq >= ?", (head - 1,))
    )
    assert f"was taken at seq {head}, but the log ends at seq {head - 2}" in _refused_copy(ws, tmp_path)
