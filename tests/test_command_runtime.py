"""The command path's cheap parts behave as the expensive ones did.

Event ids are still uuid4 hex; log lines still carry their context whichever logging is
set up (and are skipped only when nothing would receive them); `fail_stage` returns the
plan the log holds, from the state it just folded.
"""

from __future__ import annotations

import logging
import uuid

import pytest
import structlog

from lifecycle_fsm import Ledger
from lifecycle_fsm.command_path import new_event_id
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.rules import plan_from_payload
from lifecycle_fsm.upcasting import decoded_payload
from tests.conftest import Workspace


def test_event_ids_are_uuid4_hex(ws: Workspace, ledger: Ledger) -> None:
    ids = {new_event_id() for _ in range(2000)}
    assert len(ids) == 2000
    for eid in list(ids)[:200]:
        parsed = uuid.UUID(hex=eid)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, eid)
    ledger.init()
    for event in ledger.events():
        assert uuid.UUID(hex=event.event_id).version == 4


@pytest.fixture
def no_structlog(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for an embedder that never set structlog up: logs go to stdlib logging."""
    monkeypatch.setattr(structlog, "is_configured", lambda: False)


@pytest.mark.usefixtures("no_structlog")
def test_stdlib_logging_at_info_gets_every_command_line(
    ws: Workspace, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lifecycle_fsm.command_path")
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.grpo())
    lines = [r.getMessage() for r in caplog.records if r.name == "lifecycle_fsm.command_path"]
    decided = [line for line in lines if line.startswith("decision_recorded ")]
    assert len(decided) == 1
    assert "candidate_id='grpo-v7'" in decided[0] and "version=1" in decided[0] and "event_id=" in decided[0]
    assert sum(line.startswith("event_appended ") for line in lines) >= 3  # init, baseline, receive


@pytest.mark.usefixtures("no_structlog")
def test_without_structlog_events_go_to_the_stdlib_logger_at_its_level(caplog: pytest.LogCaptureFixture) -> None:
    """An embedder that configured no structlog gets the library's events from stdlib logging, at its level."""
    log = get_logger("lifecycle_fsm.command_path")
    caplog.set_level(logging.WARNING, logger="lifecycle_fsm.command_path")
    log.info("event_appended", seq=1)
    log.warning("command_retried", attempt=2)
    assert [r.getMessage() for r in caplog.records] == ["command_retried attempt=2"]


def test_structlog_gets_every_command_line(ws: Workspace, ledger: Ledger) -> None:
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    with structlog.testing.capture_logs() as logs:
        ledger.receive(ws.grpo())
    (decided,) = [e for e in logs if e["event"] == "decision_recorded"]
    assert (decided["candidate_id"], decided["version"], decided["state"]) == ("grpo-v7", 1, "received")


def test_fail_returns_the_plan_the_log_holds(ws: Workspace, ledger: Ledger) -> None:
    """The plan built from the folded state equals the one read back from the stored row."""
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.grpo())
    for stage in ("sampling", "reward", "sampling"):
        result = ledger.fail_stage("grpo-v7", stage)
        (planned,) = [e for e in result.events if e.type == "RecoveryPlanned"]
        assert result.plan == plan_from_payload(decoded_payload(planned), seq=planned.seq)
        ledger.complete_recovery("grpo-v7")
