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


def test_a_value_with_a_newline_or_an_escape_cannot_forge_a_line(ws: Workspace) -> None:
    """A manifest's `evaluation_version` of "v3\\nartifact: passed (FORGED)" printed, in `explain` (text and md)
    and in the report, a line of its own that read as a check result; an actor holding a newline and a terminal
    escape (`--actor`) printed a forged `log` line and sent the escape to the terminal (refused now). Every value
    is one line, its control characters spelled out (`\\n`, `\\x1b`), as tables and errors already were."""
    forged = "artifact: passed (FORGED)"
    assert invoke(ws.db, "init").exit_code == 0
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline())).exit_code == 0
    manifest = ws.dpo(evaluation_version=f"frozen-eval-v3\n{forged}\x1b[32m")
    actor = "bob\n      99  2026-01-01T00:00:00Z  ledger  Forged\x1b[31m"
    refused = invoke(ws.db, "--actor", actor, "receive", str(manifest))  # no actor holds a control character
    assert refused.exit_code == 3 and "actor" in refused.stderr and "\x1b" not in refused.stderr
    assert invoke(ws.db, "--actor", "bob", "receive", str(manifest)).exit_code == 0
    assert invoke(ws.db, "check", "dpo-v5").exit_code == 0
    outputs = {
        "explain": invoke(ws.db, "explain", "dpo-v5").stdout,
        "explain md": invoke(ws.db, "explain", "dpo-v5", "--format", "md").stdout,
        "log": invoke(ws.db, "log").stdout,
    }
    assert invoke(ws.db, "report", "--out", str(ws.root / "r")).exit_code == 0
    outputs["report"] = (ws.root / "r" / "ledger-report.md").read_text()
    for name, text in outputs.items():
        assert "\x1b" not in text, name
        for line in text.splitlines():
            assert not line.lstrip(" -").startswith((forged, "99  2026")), (name, line)
    assert "frozen-eval-v3\\nartifact: passed (FORGED)\\x1b[32m" in outputs["explain"]
    assert len(outputs["log"].splitlines()) == 4 and "by bob" in outputs["log"]


def test_a_pool_file_or_a_dry_run_manifest_cannot_forge_a_line(ws: Workspace) -> None:
    """`decisions replay` printed a pool file's candidate id, and `audit`'s dry run a manifest's upstream
    decision, as written: a newline in them printed a line of their own. Each is one line, spelled out."""
    import json

    pool = ws.root / "pool"
    pool.mkdir()
    candidate = {
        "candidate_kind": "dpo",
        "source_policy_version": "p0",
        "policy_version": "d1",
        "evaluation_version": "e1",
        "preference_evidence_version": "pref",
        "verifier_version": None,
        "evidence_window_index": None,
    }
    settings = {"active_policy_version": "p0", "active_window": 1, "max_window_age": 2, "evaluation_version": None}
    doc = {
        "schema": "lifecycle-decision-pool/v1",
        "decision": "handoff",
        "candidate_id": "d1\nFORGED",
        "seq": 5,
        "event_type": "HandoffDecided",
        "decided": {"handoff_status": "ready_for_evaluation", "hard_failures": []},
        "inputs": {
            "candidate": candidate,
            "settings": settings,
            "artifact_verified": True,
            "rollback_verified": True,
            "path_escapes_root": False,
            "upstream_decision": "tune",
        },
    }
    (pool / "a.json").write_text(json.dumps(doc))
    replayed = invoke(ws.db, "decisions", "replay", str(pool))
    assert replayed.exit_code == 8 and "changed: d1\\nFORGED seq 5" in replayed.stdout
    assert not [line for line in replayed.stdout.splitlines() if line.startswith("FORGED")]
    planned = invoke(
        ws.db,
        "audit",
        "--baseline",
        str(ws.baseline()),
        "--candidates",
        str(ws.dpo(decision="accept\nFORGED")),
        "--label",
        "x",
    )
    assert planned.exit_code == 0 and "upstream accept\\nFORGED)" in planned.stdout
    assert not [line for line in planned.stdout.splitlines() if line.startswith("FORGED")]
