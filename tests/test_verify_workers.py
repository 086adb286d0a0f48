"""`verify` with worker processes: row hashes re-computed over slices of the log in other processes,
positions and links walked in order here. Its report is the one-process report, break or not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from backends import Backend, backend_params, make_backend
from conftest import Workspace

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import verify
from lifecycle_fsm.store import EventStore


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
