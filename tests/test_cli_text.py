"""What a person sees without --json: tables and explanations name the evidence."""

from __future__ import annotations

from conftest import Workspace, invoke


def _session(ws: Workspace) -> None:
    queue = ws.root / "queue.jsonl"
    queue.write_text("{}\n")
    for args in (
        ["init"],
        ["baseline", "activate", str(ws.baseline())],
        ["receive", str(ws.grpo())],
        ["trusted", "grpo-v7", "prompt_queue", str(queue)],
        ["fail", "grpo-v7", "--stage", "sampling"],
    ):
        assert invoke(ws.db, *args).exit_code == 0, args


def test_history_status_and_explain_as_text(ws: Workspace) -> None:
    """history lists triggers, status lists states, explain names the recovery and what changed."""
    _session(ws)
    history = invoke(ws.db, "history", "grpo-v7").stdout
    assert "CandidateReceived" in history and "plan_recovery" in history
    status = invoke(ws.db, "status").stdout
    assert "grpo-v7" in status and "recovering" in status
    explain = invoke(ws.db, "explain", "grpo-v7").stdout
    assert "recovery: sampling -> retry_sampling_from_prompt_queue" in explain
    assert invoke(ws.db, "recovered", "grpo-v7").exit_code == 0
    assert invoke(ws.db, "check", "grpo-v7").exit_code == 0
    assert "window advanced" in invoke(ws.db, "window", "2").stdout
    explain = invoke(ws.db, "explain", "grpo-v7").stdout
    assert "reason codes: window_changed" in explain
    assert "window changed: 1 -> 2" in explain


def test_fail_prints_the_plan_and_empty_status(ws: Workspace) -> None:
    """A fresh ledger says it has no candidates; `fail` prints the action and what it reuses."""
    assert invoke(ws.db, "init").exit_code == 0
    assert "no candidates" in invoke(ws.db, "status").stdout
    _session_without_fail = ws.baseline()
    assert invoke(ws.db, "baseline", "activate", str(_session_without_fail)).exit_code == 0
    assert invoke(ws.db, "receive", str(ws.dpo())).exit_code == 0
    out = invoke(ws.db, "fail", "dpo-v5", "--stage", "update").stdout
    assert "update failed -> rollback_to_verified_baseline (reuse verified_baseline); state recovering" in out
    out = invoke(ws.db, "replay").stdout
    assert "replayed from the beginning" in out and "dpo-v5" in out
