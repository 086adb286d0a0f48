"""The shipped drills once more, each against a fresh PostgreSQL schema instead of an SQLite file.

Faults damage the PostgreSQL ledger as they damage the file: a writer process killed
inside its transaction, a checkpoint row garbled and an event row edited with plain
psycopg (the append-only trigger disabled first, as a tamperer with the owner's role
would). Every expectation must hold exactly as on SQLite.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from backends import pg_execute
from conftest import REPO

from lifecycle_fsm.replay.drills import load_scenario, run_scenario
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.open import describe_target, open_store

pytestmark = pytest.mark.postgres

SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_passes_on_postgres(path: Path, pg_url: str) -> None:
    """Every shipped scenario passes on PostgreSQL; its ledger verifies afterwards unless it was tampered with."""
    scenario = load_scenario(path)
    result = run_scenario(scenario, ledger_url=pg_url)
    assert result.ok, "\n".join(f.message() for f in result.failures)
    assert len(result.steps) == result.steps_total
    assert pg_execute(pg_url, "SELECT count(*) FROM events") == [(result.events,)]
    if not any(step.action == "tamper_event" for step in scenario.steps):
        store = open_store(pg_url, create=False)
        with closing(store):
            assert verify_chain(store).ok


def test_tamper_drill_on_postgres_leaves_the_guard_on(pg_url: str, tmp_path: Path) -> None:
    """After the tamper fault the triggers are enabled again; `keep` names the schema, copies no file."""
    scenario = load_scenario(next(p for p in SHIPPED if "tamper_event" in p.read_text()))
    result = run_scenario(scenario, ledger_url=pg_url, keep_dir=tmp_path)
    assert result.ok, "\n".join(f.message() for f in result.failures)
    disabled = "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'events'::regclass AND tgenabled = 'D'"
    assert pg_execute(pg_url, disabled) == [(0,)]
    assert result.kept == describe_target(pg_url) and list(tmp_path.iterdir()) == []
