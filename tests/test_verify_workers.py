"""`verify` with worker processes, each walking a slice of the chain and folding a share of the streams.
Its report is the one-process report, break or not: in the chain, in the fold, in a checkpoint."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from backends import Backend, backend_params, make_backend, pg_execute
from conftest import Workspace

from lifecycle_fsm.events import SEALS_STREAM
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import take_checkpoint, verify
from lifecycle_fsm.replay.verify import _share_out
from lifecycle_fsm.store import EventStore
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import NewEvent


@pytest.fixture(params=backend_params(("sqlite", "postgres")))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
def ledger(backend: Backend, ws: Workspace) -> Any:
    """A ledger of some forty events: a baseline, candidates received, trusted states recorded."""
    store = backend.open()
    led = Ledger(store, actor="t")
    led.activate_baseline(ws.baseline())
    for i in range(6):
        led.receive(ws.dpo(f"dpo-{i}"), candidate_id=f"c{i}")
        for kind in ("prompt_queue", "trajectories"):
            trusted = ws.root / f"{kind}-{i}.jsonl"
            trusted.write_text('{"n": 1}\n')
            led.record_trusted_state(f"c{i}", kind, trusted)
    yield store
    store.close()


def _both(store: EventStore, backend: Backend) -> tuple[dict[str, Any], dict[str, Any]]:
    assert backend.target is not None
    return verify(store), verify(store, workers=2, target=backend.target)


def test_a_sound_ledger_verifies_the_same_with_workers(ledger: EventStore, backend: Backend) -> None:
    one, two = _both(ledger, backend)
    assert one["ok"] and two == one
    assert verify(ledger, workers=2) == one  # no target to open: folded in this process


@pytest.mark.parametrize("seq", [1, 9, 17])
def test_an_edited_row_is_found_at_its_seq_with_workers(ledger: EventStore, backend: Backend, seq: int) -> None:
    """A payload edited in place: a worker's slice finds the row's own hash broken."""
    backend.tamper(seq, "actor", "mallory")
    one, two = _both(ledger, backend)
    assert not one["ok"] and one["bad_seq"] == seq and two == one


def test_a_relinked_or_removed_row_is_found_by_the_walk_in_order(ledger: EventStore, backend: Backend) -> None:
    """A link edited (the row's own hash still holds only if recomputed: here it does not, and the
    link's finding comes first at the same seq); a removed row (a gap) at the next one."""
    backend.tamper(12, "prev_hash", "0" * 64)
    one, two = _both(ledger, backend)
    assert one["bad_seq"] == 12 and "prev_hash" in one["reason"] and two == one
    backend.delete(5)
    one, two = _both(ledger, backend)
    assert one["bad_seq"] == 6 and "gap" in one["reason"] and two == one


def test_a_break_where_two_slices_meet_is_found_by_joining_them(ledger: EventStore, backend: Backend) -> None:
    """The second slice's first row relinked, then the first slice's last row removed: only the join
    of the two slices sees either (each worker trusts its own first row's link)."""
    last = -(-ledger.head().seq // 2)  # the first of two slices ends here
    backend.tamper(last + 1, "prev_hash", "0" * 64)
    one, two = _both(ledger, backend)
    assert one["bad_seq"] == last + 1 and "prev_hash" in one["reason"] and two == one
    backend.delete(last)
    one, two = _both(ledger, backend)
    assert one["bad_seq"] == last + 1 and f"follows seq {last - 1}" in one["reason"] and two == one


CLOCK = "2026-12-01T00:00:00.000000Z"


def _raw(store: EventStore, stream_id: str, type_name: str, payload: dict[str, Any]) -> int:
    """Append an event through the store, which keeps events opaque: the chain holds whatever the fold makes of it."""
    event = NewEvent(stream_id, type_name, 1, payload, str(uuid.uuid4()), CLOCK, "t")
    return store.append(stream_id, store.stream_version(stream_id), [event]).events[0].seq


def _in_two_shares(store: EventStore) -> tuple[str, str]:
    """A candidate of each share the two workers fold (`_share_out`, from the stream index)."""
    first, second = _share_out(store.streams(), 2)
    return (
        next(f"c{i}" for i in range(6) if second.holds(f"candidate:c{i}")),
        next(f"c{i}" for i in range(6) if first.holds(f"candidate:c{i}")),
    )


def test_a_healthy_ledger_with_checkpoints_and_a_seal_verifies_the_same(ledger: EventStore, backend: Backend) -> None:
    """The shares' states merged at each checkpoint and at the head: every checkpoint compared, the
    stream index matched (candidates, the ledger's settings, the seals stream's version)."""
    take_checkpoint(ledger, clock=lambda: CLOCK, to=9)
    take_checkpoint(ledger, clock=lambda: CLOCK)
    _raw(ledger, SEALS_STREAM, "HeadSealed", {"seq": 3})
    Ledger(ledger, actor="t").advance_window(2)
    one, two = _both(ledger, backend)
    assert one["ok"] and [c["status"] for c in one["checkpoints"]] == ["ok", "ok"]
    assert two == one


def test_a_replay_break_in_the_middle_is_found_at_its_seq_with_workers(ledger: EventStore, backend: Backend) -> None:
    """A sound chain whose fold fails at two rows, each in another worker's share: the first in seq
    order is the finding (the first share's failure comes later in the log)."""
    take_checkpoint(ledger, clock=lambda: CLOCK)
    first, later = _in_two_shares(ledger)
    bad = _raw(ledger, f"candidate:{first}", "TrustedStateRecorded", {"kind": "prompt_queue"})
    _raw(ledger, f"candidate:{later}", "RecoveryCompleted", {"stage": "reward", "action": "resume"})
    one, two = _both(ledger, backend)
    assert not one["ok"] and one["bad_seq"] == bad and one["problems"][0]["code"] == "replay", one
    assert "does not match its schema" in one["reason"]
    assert one["checkpoints"] is None and one["details"] == {}  # not compared past a broken replay; no move to detail
    assert two == one


def test_a_forged_checkpoint_is_broken_with_workers(ledger: EventStore, backend: Backend) -> None:
    """A snapshot rewritten with a matching sha256: the merged state at its position differs, as one fold's does."""
    good = take_checkpoint(ledger, clock=lambda: CLOCK, to=20)
    bad = take_checkpoint(ledger, clock=lambda: CLOCK)
    Ledger(ledger, actor="t").advance_window(2)
    data = orjson.loads(bad.snapshot)
    data["candidates"]["c3"]["state"] = "reject"
    forged = canonical_json(data)
    _edit_checkpoint(backend, bad.checkpoint_id, forged, hashlib.sha256(forged.encode()).hexdigest())
    one, two = _both(ledger, backend)
    statuses = {c["checkpoint_id"]: c["status"] for c in one["checkpoints"]}
    assert statuses == {good.checkpoint_id: "ok", bad.checkpoint_id: "broken"} and one["bad_seq"] == bad.position
    assert two == one


def _edit_checkpoint(backend: Backend, checkpoint_id: int, snapshot: str, digest: str) -> None:
    if backend.name == "sqlite":
        with sqlite3.connect(str(backend.target), isolation_level=None) as conn:
            conn.execute(
                "UPDATE checkpoints SET snapshot = ?, snapshot_sha256 = ? WHERE checkpoint_id = ?",
                (snapshot, digest, checkpoint_id),
            )
    else:
        assert backend.target is not None
        update = "UPDATE checkpoints SET snapshot = %s, snapshot_sha256 = %s WHERE checkpoint_id = %s"
        pg_execute(backend.target, "ALTER TABLE checkpoints DISABLE TRIGGER USER")
        pg_execute(backend.target, update, (snapshot, digest, checkpoint_id))
        pg_execute(backend.target, "ALTER TABLE checkpoints ENABLE TRIGGER USER")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_report_is_of_the_ledger_as_its_first_read_found_it(
    ledger: EventStore, backend: Backend, workers: int
) -> None:
    """Another handle appends (its own thread, as each handle must be) just after verify's first read:
    the report, the walk and the workers' share of it, is of the ledger as that read found it."""
    assert backend.target is not None
    before, first_read = ledger.head(), ledger.state_index

    def append() -> None:
        other = backend.open()
        try:
            Ledger(other, actor="t").advance_window(2)
        finally:
            other.close()

    def then_another_appends() -> Any:
        found = first_read()
        writer = threading.Thread(target=append)
        writer.start()
        writer.join(timeout=30)
        assert not writer.is_alive()
        return found

    ledger.state_index = then_another_appends  # type: ignore[method-assign]
    report = verify(ledger, workers=workers, target=backend.target)
    del ledger.state_index
    assert report["ok"] and (report["events"], report["head"]["seq"]) == (before.seq, before.seq), report
    assert verify(ledger)["events"] == before.seq + 1
