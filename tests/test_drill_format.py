"""The scenario format: every failure reported, refusals, deltas, explain and as-of expectations,
crash around any command, concurrent writers, restore, edit, inconclusive faults, JSON-ish messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import invoke

from lifecycle_fsm.errors import ScenarioError
from lifecycle_fsm.replay.drills import load_scenario, run_scenario

HEAD = """\
name: t
seed: 5
artifacts:
  sft: {type: baseline}
  sft-v2: {type: baseline}
  dpo-v5: {type: dpo}
steps:
  - activate_baseline: sft
  - receive: dpo-v5
  - check: dpo-v5
"""


def _scenario(tmp_path: Path, steps: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(HEAD + steps)
    return path


def _failures(tmp_path: Path, steps: str) -> list[str]:
    return [f.message() for f in run_scenario(load_scenario(_scenario(tmp_path, steps))).failures]


def test_every_failed_expectation_is_reported(tmp_path: Path) -> None:
    """A failed step does not stop the scenario: both wrong expectations, and the command between, are reported."""
    messages = _failures(
        tmp_path,
        """\
  - expect: {candidate: dpo-v5, state: ready, handoff: tune}
  - hand_off: nobody
  - expect: {verify_ok: false}
""",
    )
    assert messages == [
        'step 4 (expect): dpo-v5 state: expected "ready", actual "verified"',
        'step 4 (expect): dpo-v5 handoff: expected "tune", actual null',
        'step 5 (hand_off): outcome: expected "success", actual "NotFoundError: unknown candidate: \'nobody\'"',
        "step 6 (expect): verify_ok: expected false, actual true",
    ]


def test_refused_matches_subclasses_unless_exact(tmp_path: Path) -> None:
    """A class name accepts its subclasses, as `except` and `pytest.raises` do (`LifecycleError`: any
    refusal); `exact: true` asks for that very class; a message is compared whole or in part."""
    messages = _failures(
        tmp_path,
        """\
  - complete_recovery: dpo-v5
    refused: LifecycleError
  - complete_recovery: dpo-v5
    refused: ConflictError
  - complete_recovery: dpo-v5
    refused: {error: IllegalCommandError, exact: true, contains: verified}
  - complete_recovery: dpo-v5
    refused: {error: ConflictError, exact: true}
  - complete_recovery: dpo-v5
    refused: {error: ConflictError, contains: no such words}
  - complete_recovery: dpo-v5
    refused: InputError
  - complete_recovery: dpo-v5
    refused: RuntimeError
  - complete_recovery: dpo-v5
    refused: ValueError
""",
    )
    assert [m.split(", actual")[0] for m in messages] == [
        'step 7 (complete_recovery): outcome: expected "refused with ConflictError exactly"',
        "step 8 (complete_recovery): outcome: expected \"refused with ConflictError (message containing 'no such "
        "words')\"",
        'step 9 (complete_recovery): outcome: expected "refused with InputError"',
        'step 11 (complete_recovery): outcome: expected "refused with ValueError"',  # a ConflictError is a RuntimeError
    ]
    assert all(', actual "IllegalCommandError: ' in m for m in messages)


def test_event_deltas_count_the_step_before(tmp_path: Path) -> None:
    assert _failures(tmp_path, "  - expect: {events: '+1'}\n  - expect: {events: '+1'}\n") == []
    assert _failures(tmp_path, "  - expect: {events: unchanged}\n") == [
        'step 4 (expect): events: expected "unchanged", actual "+1"'
    ]


def test_explain_and_as_of_expectations(tmp_path: Path) -> None:
    messages = _failures(
        tmp_path,
        """\
  - expect: {candidate: dpo-v5, explain: {seq: 4, type: ChecksRecorded, evidence: {artifact.verified: true}}}
  - expect: {candidate: dpo-v5, as_of: 3, state: received}
  - expect: {candidate: dpo-v5, as_of: 3, state: verified, explain: {evidence: {nope.x: 1}}}
""",
    )
    assert messages == [
        'step 6 (expect): dpo-v5 state: expected "verified", actual "received"',
        'step 6 (expect): dpo-v5 explain: expected {"evidence": {"nope.x": 1}}, '
        'actual {"evidence": {"nope.x": "(no field nope.x)"}}',
    ]


def test_crash_that_never_fires_fails_instead_of_passing(tmp_path: Path) -> None:
    """A one-commit command with K = 2 finishes: the crash did not happen, so the step fails."""
    messages = _failures(tmp_path, "  - crash: {at: before_commit, commit: 2, run: {check: dpo-v5}}\n")
    assert messages == [
        'step 4 (crash): killed: expected "SIGKILL at before_commit on commit 2", '
        'actual "exit 0 after done (the command made fewer than 2 commits)"'
    ]


def test_crash_before_and_after_commit_of_baseline_activate(tmp_path: Path) -> None:
    """Before COMMIT nothing of the fan-out survives; after COMMIT all of it does."""
    result = run_scenario(
        load_scenario(
            _scenario(
                tmp_path,
                """\
  - crash: {at: before_commit, run: {activate_baseline: sft-v2}}
  - expect: {events: unchanged, candidate: dpo-v5, state: verified}
  - crash: {at: after_commit, run: {activate_baseline: sft-v2}}
  - expect: {events: "+2", candidate: dpo-v5, state: received}
""",
            )
        )
    )
    assert result.ok, [f.message() for f in result.failures]
    assert result.steps[3].detail == {
        "command": "activate_baseline",
        "fault": "kill@before_commit#1",
        "returncode": -9,
        "events_appended": 0,
    }
    assert result.steps[5].detail["events_appended"] == 2


def test_concurrent_writers_must_all_succeed_unless_refused(tmp_path: Path) -> None:
    """A writer whose command is refused without `refused:` fails the step, naming the writer."""
    messages = _failures(
        tmp_path,
        """\
  - concurrently:
      mode: threads
      writers:
        - check: dpo-v5
        - complete_recovery: dpo-v5
""",
    )
    assert len(messages) == 1 and messages[0].startswith(
        'step 4 (concurrently): writers[1]: expected "success", actual "IllegalCommandError: '
    )


def test_fault_that_cannot_be_injected_is_inconclusive(tmp_path: Path) -> None:
    """On an in-memory ledger no other process or driver can reach the rows: the faults prove nothing."""
    path = _scenario(tmp_path, "  - crash: {at: before_commit, run: {check: dpo-v5}}\n  - tamper_event: {seq: 2}\n")
    result = run_scenario(load_scenario(path), ledger_url=":memory:")
    assert not result.ok and result.result == "inconclusive" and not result.failures
    assert result.inconclusive == (
        "step 4 (crash): crash needs the ledger's file or server; this ledger is neither",
        "step 5 (tamper_event): tamper_event needs the ledger's file or server; this ledger is neither",
    )
    assert run_scenario(load_scenario(path)).result == "pass"


def test_restore_without_damage_fails(tmp_path: Path) -> None:
    assert _failures(tmp_path, "  - restore_artifact: dpo-v5\n") == [
        'step 4 (restore_artifact): restore: expected "dpo-v5 tampered with or deleted before", actual "never damaged"'
    ]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ("  - expect: {events: '+x'}\n", 'step 4 (expect): key \'events\': must be a count, "+N" or "unchanged"'),
        ("  - crash: {at: before_commit, run: {expect: {events: 1}}}\n", "step 4: key 'run': must be a ledger command"),
        ("  - crash: {at: during, run: {check: dpo-v5}}\n", "key 'at': must be one of before_commit, after_commit"),
        (
            "  - concurrently: {writers: [{check: dpo-v5}]}\n",
            "key 'writers': must be a list of 2 to 32 command steps, not 1",
        ),
        (
            "  - edit_manifest: {artifact: dpo-v5, set: {colour: red}}\n",
            "set: key 'colour': unknown key (expected one of",
        ),
        ("  - expect: {as_of: 2}\n", "key 'as_of': needs `candidate:`"),
        ("  - expect: {candidate: dpo-v5, as_of: 2, handoff: tune}\n", "key 'as_of': applies to state"),
        ("  - check: dpo-v5\n    refused: {error: Nope}\n", "key 'error': unknown error class 'Nope'"),
        ("  - advance_window: two\n", "key 'window': must be an integer, not 'two'"),
    ],
)
def test_new_keys_are_validated(tmp_path: Path, steps: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(_scenario(tmp_path, steps))
    assert expected in str(e.value)


def test_verify_names_the_checkpoint_position_for_a_checkpoint_fault(tmp_path: Path) -> None:
    """`verify` on a garbled checkpoint says what is broken and where (its position), never `BROKEN at seq None`."""
    path = _scenario(tmp_path, "  - checkpoint:\n  - corrupt_checkpoint:\n")
    run_scenario(load_scenario(path), keep_dir=tmp_path / "kept")
    result = invoke(tmp_path / "kept" / "t.db", "verify")
    assert result.exit_code == 6
    assert re.match(r"BROKEN at seq \d+: checkpoint 1: ", result.output) and "None" not in result.output


def test_exactly_n_of_the_writers_are_refused(tmp_path: Path) -> None:
    """`refused:` on a `concurrently` step: exactly `count` (default 1) of the writers' commands are
    refused with that error and every other one succeeds: two racing hand-offs, one wins."""
    race = "  - concurrently:\n      writers: [{handoff: dpo-v5}, {hand_off: dpo-v5}]\n    refused: REFUSED\n"
    assert _failures(tmp_path, race.replace("REFUSED", "IllegalCommandError")) == []
    [message] = _failures(tmp_path, race.replace("REFUSED", "{error: IllegalCommandError, count: 2}"))
    assert message == (
        'step 4 (concurrently): refused: expected "exactly 2 of the 2 commands refused with IllegalCommandError, '
        'the others succeeding", actual "1 refused with IllegalCommandError"'
    )
    [message] = _failures(tmp_path, race.replace("REFUSED", "InputError"))
    assert message.startswith(
        'step 4 (concurrently): refused: expected "exactly 1 of the 2 commands refused with '
        'InputError, the others succeeding", actual "0 refused with InputError; '
        "IllegalCommandError: candidate "
    )


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (
            "  - check: dpo-v5\n    refused: {error: InputError, count: 1}\n",
            "step 4 (check): key 'refused': `count` is for a concurrently step",
        ),
        (
            "  - concurrently: {writers: [{check: dpo-v5, refused: InputError}, {check: dpo-v5}]}\n"
            "    refused: InputError\n",
            "step 4 (concurrently): key 'refused': give it on the step or on its writers, not both",
        ),
        ("  - checkpoint:\n    refused: InputError\n", "step 4 (checkpoint): key 'refused': only ledger commands"),
    ],
)
def test_refused_counts_belong_to_concurrent_steps(tmp_path: Path, steps: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(_scenario(tmp_path, steps))
    assert expected in str(e.value)


CLI_WORDS = """\
  - trusted: {candidate: dpo-v5, kind: prompt_queue, artifact: sft}
  - untrust: {candidate: dpo-v5, kind: prompt_queue}
  - fail: {candidate: dpo-v5, stage: artifact_validation}
  - recovered: dpo-v5
  - check: dpo-v5
  - handoff: dpo-v5
  - window: 2
  - evaluation activate: eval-v1
  - baseline activate: sft-v2
  - expect: {candidate: dpo-v5, state: received, events: 15}
  - hand_off: dpo-v5
    refused: IllegalCommandError
"""


def test_cli_command_names_are_step_names(tmp_path: Path) -> None:
    """Each CLI command's name is accepted where a step is named, and a step is reported in the words
    the file used for it."""
    scenario = load_scenario(_scenario(tmp_path, CLI_WORDS))
    assert [s.action for s in scenario.steps[3:]] == [
        "record_trusted_state",
        "invalidate_trusted_state",
        "fail_stage",
        "complete_recovery",
        "check",
        "hand_off",
        "advance_window",
        "activate_evaluation",
        "activate_baseline",
        "expect",
        "hand_off",
    ]
    result = run_scenario(scenario)
    assert result.ok, [f.message() for f in result.failures]
    assert [s.action for s in result.steps[-6:]] == [
        "handoff",
        "window",
        "evaluation activate",
        "baseline activate",
        "expect",
        "hand_off",
    ]
    wrong = CLI_WORDS.replace("  - hand_off: dpo-v5\n    refused: IllegalCommandError\n", "  - handoff: nobody\n")
    assert _failures(tmp_path, wrong)[0].startswith('step 14 (handoff): outcome: expected "success"')
    for word in ("handoff", "hand_off"):
        with pytest.raises(ScenarioError, match=rf"step 4 \({word}\): key 'candidate': is required"):
            load_scenario(_scenario(tmp_path, f"  - {word}: {{}}\n"))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ("  - hand-off: dpo-v5\n", "step 4: key 'hand-off': unknown step, did you mean 'handoff'?"),
        ("  - recoverd: dpo-v5\n", "step 4: key 'recoverd': unknown step, did you mean 'recovered'?"),
        ("  - expect: {candidate: dpo-v5, stat: verified}\n", "key 'stat': unknown key, did you mean 'state'?"),
        ("  - check: dpo-v5\n    refused: IlegalCommandError\n", "did you mean 'IllegalCommandError'?"),
        ("  - check: dpo-v5\n    refusd: InputError\n", "key 'refusd': unknown step, did you mean 'refused'?"),
    ],
)
def test_unknown_names_get_a_suggestion(tmp_path: Path, steps: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(_scenario(tmp_path, steps))
    assert expected in str(e.value)


def test_a_crash_during_append_whose_commands_were_refused_says_why(tmp_path: Path) -> None:
    """The writer was never killed because its command was refused: the failure names the refusal."""
    failures = _failures(tmp_path, "  - crash_during_append: {candidate: nobody}\n")
    assert failures[0] == (
        "step 4 (crash_during_append): returncode: expected -9, "
        "actual \"0 (NotFoundError: unknown candidate: 'nobody')\""
    )


def test_a_file_named_twice_runs_once(tmp_path: Path) -> None:
    """`drill f.yaml f.yaml` (or a folder and a file in it) is one scenario, not a name clash with itself."""
    from lifecycle_fsm.replay.drills.loader import find_scenarios

    path = _scenario(tmp_path, "")
    assert find_scenarios([path, tmp_path, str(path)]) == [path]
