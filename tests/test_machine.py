"""Tests for the candidate state machine's table (SPEC §4), written out independently."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lifecycle_fsm.machine import (
    INITIAL_TRIGGERS,
    TABLE,
    TABLE_DIGEST,
    TRANSITIONS,
    State,
    allowed_commands,
    allowed_triggers,
    command_allowed,
    diagram,
    new_machine,
)

MACHINE = new_machine()

REPO = Path(__file__).resolve().parent.parent

STATES = ["received", "verified", "recovering", "tune", "reject", "ready"]
ALIVE = ["received", "verified", "recovering", "tune", "ready"]
DECIDED = ["verified", "ready", "tune"]
CAN_FAIL = ["received", "verified", "recovering"]


def _expected_table() -> dict[tuple[str | None, str], str]:
    """SPEC §4 transcribed by hand, one row per (state, trigger)."""
    table: dict[tuple[str | None, str], str] = {(None, "receive"): "received", ("tune", "revise"): "received"}
    table[(None, "register")] = "received"  # a candidate that exists before its adapter
    table[("received", "complete_registration")] = "received"  # ... until its adapter is received
    table[("received", "pass_checks")] = "verified"
    for state in DECIDED:
        table[(state, "pass_checks")] = state
    for state in ["received", *DECIDED]:
        table[(state, "fail_checks")] = "reject"
        table[(state, "check_inconclusive")] = state  # the environment kept an artifact from being read
    table[("verified", "hand_off_inconclusive")] = "verified"
    for state in CAN_FAIL:
        table[(state, "fail_stage")] = state
    for state in [*CAN_FAIL, "ready"]:  # after hand-off, only artifact validation (export, merge) fails
        table[(state, "fail_artifact_validation")] = state
        table[(state, "plan_recovery")] = "recovering"
        table[(state, "block_recovery")] = "reject"
    table[("recovering", "complete_recovery")] = "received"
    table[("verified", "hand_off_ready")] = "ready"
    table[("verified", "hand_off_tune")] = "tune"
    table[("verified", "hand_off_reject")] = "reject"
    for state in DECIDED:
        table[(state, "invalidate_evidence")] = "received"
    for state in ALIVE:
        table[(state, "record_trusted_state")] = state
        table[(state, "invalidate_trusted_state")] = state
    return table


EXPECTED = _expected_table()
TRIGGERS = sorted({trigger for _state, trigger in EXPECTED})
ALL_PAIRS = [(state, trigger) for state in [None, *STATES] for trigger in TRIGGERS]


def test_states_are_the_six_of_the_spec() -> None:
    """The State enum holds exactly SPEC §4's six states."""
    assert [s.value for s in State] == STATES


def test_table_has_nothing_missing() -> None:
    """Every move SPEC §4 allows is in TABLE, with the same destination."""
    missing = {key: dest for key, dest in EXPECTED.items() if TABLE.get(key) != dest}
    assert missing == {}


def test_table_has_nothing_extra() -> None:
    """TABLE allows no move that SPEC §4 does not list."""
    extra = {key: dest for key, dest in TABLE.items() if key not in EXPECTED}
    assert extra == {}
    assert TABLE == EXPECTED


def test_triggers_in_transitions_are_the_spec_triggers() -> None:
    """The declarative list names exactly the spec's triggers besides the initial `receive` and `register`."""
    assert set(INITIAL_TRIGGERS) == {"receive", "register"}
    assert {t["trigger"] for t in TRANSITIONS} == set(TRIGGERS) - {"receive", "register"}


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_reject_is_terminal(trigger: str) -> None:
    """No trigger leads anywhere from `reject`."""
    assert TABLE.get(("reject", trigger)) is None
    assert ("reject", trigger) not in TABLE
    assert MACHINE.get_transitions(trigger, source="reject") == []


@pytest.mark.parametrize(("state", "trigger"), ALL_PAIRS)
def test_next_state_follows_the_spec(state: str | None, trigger: str) -> None:
    """The table gives the spec's destination, or None where the spec forbids the move."""
    assert TABLE.get((state, trigger)) == EXPECTED.get((state, trigger))


def test_next_state_of_unknown_trigger_or_state() -> None:
    """Unknown triggers and states are simply not allowed (None), never an exception."""
    assert TABLE.get(("received", "to_reject")) is None
    assert TABLE.get(("limbo", "pass_checks")) is None
    assert TABLE.get((None, "pass_checks")) is None


@pytest.mark.parametrize("state", [None, *STATES])
def test_allowed_triggers(state: str | None) -> None:
    """allowed_triggers lists, sorted, exactly the triggers the spec allows from a state."""
    expected = sorted(trigger for (source, trigger) in EXPECTED if source == state)
    assert allowed_triggers(state) == expected


@pytest.mark.parametrize("state", list(State))
def test_a_state_member_is_asked_as_its_value(state: State) -> None:
    """`transitions` takes an Enum member for its *name* (READY), which no state has: a member
    (what `CandidateState.state` holds) must be asked about as its value, or every move looks forbidden."""
    assert allowed_triggers(state) == allowed_triggers(state.value)
    assert allowed_commands(state) == allowed_commands(state.value)
    assert command_allowed(state, ["revise"]) is (state is State.TUNE)


def test_allowed_triggers_examples() -> None:
    """Spot checks: nothing from reject, only `receive` before the first event."""
    assert allowed_triggers("reject") == []
    assert allowed_triggers(None) == ["receive", "register"]
    assert allowed_triggers("recovering") == [  # no check from recovering: nothing inconclusive either
        "block_recovery",
        "complete_recovery",
        "fail_artifact_validation",
        "fail_stage",
        "invalidate_trusted_state",
        "plan_recovery",
        "record_trusted_state",
    ]


@pytest.mark.parametrize(("state", "trigger"), [(s, t) for s in STATES for t in TRIGGERS])
def test_machine_agrees_with_table(state: str, trigger: str) -> None:
    """The shared transitions Machine allows a move iff TABLE does, with the same destination."""
    found = MACHINE.get_transitions(trigger, source=state)
    if (state, trigger) in TABLE:
        assert len(found) == 1
        assert found[0].dest == TABLE[(state, trigger)]
    else:
        assert found == []


@pytest.mark.parametrize("state", STATES)
def test_machine_has_no_auto_transitions(state: str) -> None:
    """No `to_<state>` back doors: the machine knows only the table's triggers."""
    triggers = set(MACHINE.get_triggers(state))
    assert not any(t.startswith("to_") for t in triggers)
    assert triggers <= set(TRIGGERS)


def _diagram_edges(text: str) -> dict[tuple[str, str], str]:
    """Parse `src --> dst: t1 | t2` lines of a Mermaid state diagram into (src, trigger) -> dst."""
    edges: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*(\w+) --> (\w+): (.+)", line)
        if match:
            for trigger in match.group(3).split("|"):
                edges[(match.group(1), trigger.strip())] = match.group(2)
    return edges


def test_diagram_is_mermaid_state_diagram() -> None:
    """diagram() is Mermaid text that starts a stateDiagram-v2 (after an optional title block)."""
    text = diagram()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines[0] == "---":  # Mermaid front matter (the title) ends at the next ---
        lines = lines[lines.index("---", 1) + 1 :]
    assert lines[0] == "stateDiagram-v2"


def test_diagram_names_every_state_and_trigger() -> None:
    """Every state appears, every trigger labels an edge, and the start edge enters `received`."""
    text = diagram()
    for state in STATES:
        assert re.search(rf"\b{state}\b", text), state
    labelled = {trigger for (_src, trigger) in _diagram_edges(text)}
    assert labelled == set(TRIGGERS) - {"receive", "register"}
    assert re.search(r"\[\*\] --> received\b", text)


def test_diagram_draws_exactly_the_table() -> None:
    """The edges drawn are exactly TABLE's moves (the unlabelled start edge aside)."""
    drawn = _diagram_edges(diagram())
    assert drawn == {key: dest for key, dest in EXPECTED.items() if key[0] is not None}


def test_fingerprint_is_sha256_hex() -> None:
    """TABLE_DIGEST is 64 lowercase hex characters."""
    assert re.fullmatch(r"[0-9a-f]{64}", TABLE_DIGEST)


def test_fingerprint_is_stable_across_processes() -> None:
    """Two fresh interpreters (different hash seeds) compute the same TABLE_DIGEST as this one."""
    code = "from lifecycle_fsm.machine import TABLE_DIGEST; print(TABLE_DIGEST)"
    outputs = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=REPO,
            check=True,
            timeout=60,
        )
        outputs.append(done.stdout.strip())
    assert outputs == [TABLE_DIGEST, TABLE_DIGEST]


def test_each_trigger_is_fired_by_its_command() -> None:
    """The command behind each trigger (what a refusal names, what `require_command` allows), by hand."""
    from lifecycle_fsm.machine import COMMAND_BY_TRIGGER

    by_command = {
        "receive": ["receive", "complete_registration", "revise"],
        "register": ["register"],
        "check": ["pass_checks", "fail_checks", "check_inconclusive"],
        "handoff": ["hand_off_inconclusive", "hand_off_ready", "hand_off_tune", "hand_off_reject"],
        "fail": ["fail_stage", "fail_artifact_validation", "plan_recovery", "block_recovery"],
        "recovered": ["complete_recovery"],
        "baseline/evaluation/window change": ["invalidate_evidence"],
        "trusted": ["record_trusted_state"],
        "untrust": ["invalidate_trusted_state"],
    }
    assert {trigger: command for command, triggers in by_command.items() for trigger in triggers} == COMMAND_BY_TRIGGER
