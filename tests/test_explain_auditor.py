"""`explain` for every reject cause: what was claimed beside what it was checked against, in text, md and JSON.

Each case builds a real ledger file with real adapter folders, rejects one candidate
for one cause, and reads `explain` through the CLI three times. The values that
prove the cause must appear in all three formats.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from auditor_cases import CASES, artifact_files, blocking_recovery, grpo_stale_window, rollback
from conftest import Workspace, invoke

from lifecycle_fsm.artifacts import hash_directory


def _explain(ws: Workspace, cid: str) -> tuple[dict[str, Any], str, str]:
    results = [invoke(ws.db, "explain", cid, "--format", fmt) for fmt in ("json", "text", "md")]
    assert [r.exit_code for r in results] == [0, 0, 0], [r.output for r in results]
    return json.loads(results[0].stdout), results[1].stdout, results[2].stdout


def _expected_values(name: str, ws: Workspace) -> tuple[Any, Any]:
    """The claimed and checked-against values each case must show, computed independently of explain."""
    sft = ws.sft_sha
    if name == "artifact":  # the manifest's hash, and the folder's as it is on disk now
        manifest = json.loads((ws.root / "dpo-tamper" / "manifest.json").read_text())
        return manifest["artifacts"]["adapter"]["sha256"], hash_directory(ws.root / "dpo-tamper" / "adapter")
    if name == "rollback":
        return sft, hash_directory(ws.root / "sft" / "adapter")
    return {
        "lineage": ("sha-of-an-older-baseline", sft),
        "dpo-no-preference-evidence": ({"preference_evidence_version": None}, "a non-empty version string"),
        "grpo-no-verifier": (
            {"verifier_version": None, "evidence_window_index": 1},
            {
                "verifier_version": "a non-empty version string",
                "active_window": 1,
                "window_age": 0,
                "max_window_age": 2,
            },
        ),
        "grpo-stale-window": (
            {"verifier_version": "math-v1", "evidence_window_index": 1},
            {
                "verifier_version": "a non-empty version string",
                "active_window": 4,
                "window_age": 3,
                "max_window_age": 2,
            },
        ),
        "grpo-no-window-index": (
            {"verifier_version": "math-v1", "evidence_window_index": None},
            {
                "verifier_version": "a non-empty version string",
                "active_window": 1,
                "window_age": None,
                "max_window_age": 2,
            },
        ),
        "upstream-reject": ("reject", "one of accept, tune, reject; reject fails"),
        "upstream-state": ("maybe", "one of accept, tune, reject; reject fails"),
    }.get(name, (None, None))


def _shown(value: Any) -> str:
    from lifecycle_fsm.replay.explanation_parts import format_value

    return format_value(value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_shows_claimed_and_checked_values_in_every_format(ws: Workspace, name: str) -> None:
    """The reason codes, the failing check's claimed and checked-against values, and the decisive seq, in all three."""
    case, codes, check_name = CASES[name]
    with ws.ledger(actor="auditor-test") as led:
        led.init()
        led.activate_baseline(ws.baseline())
        cid = case(ws, led)
        assert led.candidate(cid).state == "reject"
    doc, text, md = _explain(ws, cid)
    assert (doc["state"], doc["reason_codes"]) == ("reject", codes)
    event = doc["decisive_event"]
    for rendered in (text, md):
        assert f"reason codes: {', '.join(codes)}" in rendered
        assert (
            f"decided by seq {event['seq']} {event['type']}, recorded {event['recorded_at']} by auditor-test"
            in rendered
        )
        assert doc["path"][-1]["to"] == "reject" and "reject (seq" in rendered
        if (rules := event["evidence"].get("rules")) is not None:  # the JSON's rules, in the text too
            assert f"decided under rules version {rules['version']} (digest {rules['digest']})" in rendered
    if check_name:
        row = next(c for c in doc["checks"] if c["check"] == check_name)
        assert row["passed"] is False
        claimed, against = _expected_values(name, ws)
        if claimed is not None or against is not None:
            assert (row["claimed"], row["checked_against"]) == (claimed, against)
        line = (
            f"{check_name}: FAILED; claimed {_shown(row['claimed'])}; checked against {_shown(row['checked_against'])}"
        )
        assert line in text and line in md, line


def test_artifact_rejection_names_the_files_that_differ(ws: Workspace) -> None:
    """A tampered adapter folder: the changed, added and removed files by relative path, with sizes and digests."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = artifact_files(ws, led)
    doc, text, md = _explain(ws, cid)
    files = doc["artifact"]["files"]
    assert files["compared"] is True
    assert [c["path"] for c in files["changed"]] == ["adapter_model.safetensors"]
    assert (files["added"], files["removed"]) == (["extra.bin"], ["adapter_config.json"])
    change = files["changed"][0]
    assert change["recorded"]["size"] == change["checked"]["size"] == 64 * 1024
    assert change["recorded"]["sha256"] != change["checked"]["sha256"]
    for rendered in (text, md):
        assert (
            f"file changed: adapter_model.safetensors (size 65536 -> 65536, sha256 {change['recorded']['sha256']}"
            in rendered
        )
        assert "file added: extra.bin" in rendered and "file removed: adapter_config.json" in rendered
    assert doc["artifact"]["at_receipt"]["actual"] == doc["artifact"]["expected"]  # it matched when received


def test_rollback_rejection_names_the_baseline_file(ws: Workspace) -> None:
    """A tampered baseline folder is compared with the listing recorded when the baseline was activated."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = rollback(ws, led)
    doc, text, _ = _explain(ws, cid)
    assert [c["path"] for c in doc["rollback"]["files"]["changed"]] == ["adapter_model.safetensors"]
    assert doc["rollback"]["activated_seq"] is not None
    assert "file changed: adapter_model.safetensors" in text and "Rollback (FAILED)" in text


def test_blocking_recovery_shows_each_trusted_state_and_why_it_was_passed_over(ws: Workspace) -> None:
    """block_update: the checkpoint was invalidated (seq and reason), the baseline's hash changed (both hashes)."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = blocking_recovery(ws, led)
    doc, text, md = _explain(ws, cid)
    recovery = doc["recovery"]
    assert (recovery["stage"], recovery["action"], recovery["blocking"]) == ("update", "block_update", True)
    outcomes = [(c["kind"], c["outcome"]) for c in recovery["considered"]]
    assert outcomes == [("pre_update_checkpoint", "invalidated"), ("verified_baseline", "hash_changed")]
    baseline = recovery["considered"][1]
    for rendered in (text, md):
        assert "recovery: update -> block_update" in rendered
        assert "considered pre_update_checkpoint: invalidated (invalidated at seq" in rendered
        assert "optimizer state lost" in rendered
        assert (
            f"considered verified_baseline: hash_changed (recorded {baseline['expected']}, now {baseline['actual']})"
            in rendered
        )


def test_settings_read_and_path_are_shown(ws: Workspace) -> None:
    """The settings the check read and every event on the path, in text as in JSON."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = grpo_stale_window(ws, led)
    doc, text, _ = _explain(ws, cid)
    assert doc["settings"]["active_window"] == 4 and doc["settings"]["window_age"] == 3
    assert "active_window: 4" in text and "window_age: 3" in text and "max_window_age: 2" in text
    assert [s["trigger"] for s in doc["path"]] == ["receive", "fail_checks"]
    for step in doc["path"]:
        assert f"seq {step['seq']} {step['type']} ({step['trigger']})" in text


def test_diagram_marks_one_candidates_path(ws: Workspace) -> None:
    """`diagram ID`: each edge it took carries the seqs that took it; visited states shaded, the last outlined."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = artifact_files(ws, led)
    doc, _, _ = _explain(ws, cid)
    received, rejected = (step["seq"] for step in doc["path"])
    text = invoke(ws.db, "diagram", cid).stdout
    assert f"[*] --> received: receive | register (taken: seq {received})" in text
    assert f"received --> reject: fail_checks | block_recovery (taken: seq {rejected})" in text
    assert "class received,reject visited" in text and "class reject current" in text
    assert text.count("(taken:") == 2
    plain = invoke(ws.db, "diagram").stdout
    assert "taken" not in plain and "classDef" not in plain
    result = invoke(ws.db, "diagram", "nope")
    assert result.exit_code == 4 and "unknown candidate" in result.stderr


def test_text_shows_the_trusted_states_and_the_last_check(ws: Workspace) -> None:
    """Text parity: the recorded trusted states and the last check's seq, as in JSON."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = blocking_recovery(ws, led)
    doc, text, _ = _explain(ws, cid)
    assert doc["trusted_states"] == {} and "Trusted states recorded now:\n  none" in text
    seq = doc["last_check_seq"]
    assert ("no check recorded" if seq is None else f"last check at seq {seq}") in text and "seq none" not in text


def test_json_and_another_format_conflict(ws: Workspace) -> None:
    """`--json` with `--format text|md` is a usage error (exit 2, one line), not a silent pick of one."""
    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        cid = blocking_recovery(ws, led)
    for args in (("--json", "explain", cid, "--format", "md"), ("explain", cid, "--format", "text", "--json")):
        result = invoke(ws.db, *args)
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and "--json asks for JSON and --format" in result.stderr
    both = invoke(ws.db, "--json", "explain", cid, "--format", "json")
    assert both.exit_code == 0 and json.loads(both.stdout)["id"] == cid


def test_rollback_evidence_is_the_activation_in_force_when_checked(ws: Workspace) -> None:
    """Each check is compared with the baseline listing recorded by the last activation at or before
    it, not a later one; a report (which reads the activations once for every candidate) says the same."""
    from lifecycle_fsm.replay.report import build_report

    with ws.ledger() as led:
        first = led.activate_baseline(ws.baseline()).events[-1].seq
        led.receive(ws.dpo("dpo-a"))
        led.check("dpo-a")
        second_sha = hash_directory(ws.adapter("sft2"))
        activated = led.activate_baseline(ws.baseline("sft2")).events
        second = next(e.seq for e in activated if e.type == "BaselineActivated")
        led.receive(ws.dpo("dpo-b", source_policy_version=second_sha))
        led.check("dpo-b")
        report = build_report(led.store).to_json()["candidates"]
    assert first < second
    for cid, seq in (("dpo-a", first), ("dpo-b", second)):
        doc, _, _ = _explain(ws, cid)
        assert doc["rollback"]["activated_seq"] == seq
        assert report[cid]["rollback"] == doc["rollback"]


def test_a_decision_under_other_rules_is_flagged_by_status_and_explain(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check recorded under rules that are not today's: `status` warns on stderr (its JSON unchanged),
    `explain` says so and names the rules it was decided under; a new check clears both."""
    from lifecycle_fsm import decisions

    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.dpo())
        monkeypatch.setattr(decisions, "RULES", {"version": 0, "digest": "0" * 64})
        led.check("dpo-v5")
    status = invoke(ws.db, "--json", "status")
    assert json.loads(status.stdout)[0]["state"] == "verified"
    assert status.stderr.startswith("warning: dpo-v5: decided under rules version 0, not today's")
    assert "`lifecycle check dpo-v5` decides it under today's" in invoke(ws.db, "explain", "dpo-v5").stdout
    doc, _, _ = _explain(ws, "dpo-v5")
    assert doc["stale_rules"] == {"version": 0, "digest": "0" * 64}
    monkeypatch.undo()
    assert invoke(ws.db, "check", "dpo-v5").exit_code == 0
    assert invoke(ws.db, "status").stderr == "" and _explain(ws, "dpo-v5")[0]["stale_rules"] is None
