"""The candidate state machine: `MOVES`, one declarative table, and everything derived from it.

Each row names the command a user types, the trigger it fires, the states it may start from and where it
leads (None: it stays). Live commands fire triggers on a `transitions.Machine` of it (`new_machine`);
replay reads `TABLE`, the same moves as a dict (no callbacks, far cheaper per event).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

if TYPE_CHECKING:  # the live machine is built by the commands that fire triggers; replay and reads need only TABLE
    from transitions import Machine


class State(StrEnum):
    """A candidate's lifecycle state; `reject` is terminal."""

    RECEIVED = "received"
    VERIFIED = "verified"
    RECOVERING = "recovering"
    TUNE = "tune"
    REJECT = "reject"
    READY = "ready"


class Move(NamedTuple):
    """One row of the table: `command` fires `trigger` from any of `sources` into `dest` (None: stays)."""

    command: str
    trigger: str
    sources: tuple[State, ...]
    dest: State | None


S = State
_ALIVE = (S.RECEIVED, S.VERIFIED, S.RECOVERING, S.TUNE, S.READY)
_DECIDED = (S.VERIFIED, S.READY, S.TUNE)
_CAN_FAIL = (S.RECEIVED, S.VERIFIED, S.RECOVERING)
_SETTING_CHANGE = "baseline/evaluation/window change"

# The triggers that start a stream (no source state): a candidate received whole, or registered before its adapter.
INITIAL_TRIGGERS = {"receive": "receive", "register": "register"}

MOVES: tuple[Move, ...] = (
    Move("receive", "complete_registration", (S.RECEIVED,), None),  # the finished adapter of a registered one
    Move("receive", "revise", (S.TUNE,), S.RECEIVED),
    Move("check", "pass_checks", (S.RECEIVED,), S.VERIFIED),
    Move("check", "pass_checks", _DECIDED, None),  # a re-check: artifacts can change after a decision
    Move("check", "fail_checks", (S.RECEIVED, *_DECIDED), S.REJECT),
    # An artifact the environment kept from being read (permission, I/O, an absent root): nothing decided.
    Move("check", "check_inconclusive", (S.RECEIVED, *_DECIDED), None),
    Move("handoff", "hand_off_inconclusive", (S.VERIFIED,), None),
    Move("fail", "fail_stage", _CAN_FAIL, None),
    # After hand-off only artifact validation can fail (an export, a merge): roll back or block the release.
    Move("fail", "fail_artifact_validation", (*_CAN_FAIL, S.READY), None),
    Move("fail", "plan_recovery", (*_CAN_FAIL, S.READY), S.RECOVERING),
    Move("fail", "block_recovery", (*_CAN_FAIL, S.READY), S.REJECT),
    Move("recovered", "complete_recovery", (S.RECOVERING,), S.RECEIVED),
    Move("handoff", "hand_off_ready", (S.VERIFIED,), S.READY),
    Move("handoff", "hand_off_tune", (S.VERIFIED,), S.TUNE),
    Move("handoff", "hand_off_reject", (S.VERIFIED,), S.REJECT),
    Move(_SETTING_CHANGE, "invalidate_evidence", _DECIDED, S.RECEIVED),
    Move("trusted", "record_trusted_state", _ALIVE, None),
    Move("untrust", "invalidate_trusted_state", _ALIVE, None),
)
del S

# The same rows as `transitions` takes them (this module imports nothing of the package, so a test can
# load it with its table changed before anything else).
TRANSITIONS: list[dict[str, Any]] = [
    {"trigger": m.trigger, "source": [s.value for s in m.sources], "dest": "=" if m.dest is None else m.dest.value}
    for m in MOVES
]
# The command behind each trigger, so refusals speak the user's language.
COMMAND_BY_TRIGGER: dict[str, str] = {**INITIAL_TRIGGERS, **{m.trigger: m.command for m in MOVES}}
# Every trigger a command may fire: the command is allowed where any of them is.
COMMAND_TRIGGERS: dict[str, frozenset[str]] = {
    command: frozenset(t for t, c in COMMAND_BY_TRIGGER.items() if c == command)
    for command in dict.fromkeys(COMMAND_BY_TRIGGER.values())
}


def _build_table() -> dict[tuple[str | None, str], str]:
    table: dict[tuple[str | None, str], str] = {(None, trigger): State.RECEIVED.value for trigger in INITIAL_TRIGGERS}
    for move in MOVES:
        for source in move.sources:
            key = (source.value, move.trigger)
            if key in table:
                raise AssertionError(f"ambiguous transition {key}")
            table[key] = source.value if move.dest is None else move.dest.value
    return table


TABLE = _build_table()
TABLE_DIGEST = hashlib.sha256(
    orjson.dumps({"states": [s.value for s in State], "transitions": TRANSITIONS}, option=orjson.OPT_SORT_KEYS)
).hexdigest()


class CandidateModel:
    """One candidate as a model of the live machine: `transitions` sets `state` and adds its triggers."""

    state: str

    def fire(self, trigger: str) -> str:
        """Fire `trigger` (MachineError when the table forbids it); the state it lands in."""
        try:
            getattr(self, trigger)()
        except AttributeError:
            from transitions import MachineError

            raise MachineError(f"{trigger} is no trigger of the lifecycle machine") from None
        return self.state


def new_machine() -> Machine:
    """A `transitions.Machine` of the table, without models: a `Ledger` adds the candidates it holds."""
    import logging

    from transitions import Machine

    # transitions logs every callback at INFO; we fire none, so keep it quiet for embedders logging at INFO.
    logging.getLogger("transitions").setLevel(logging.WARNING)
    return Machine(
        model=None,
        states=[s.value for s in State],
        transitions=TRANSITIONS,
        initial=State.RECEIVED.value,
        auto_transitions=False,
        send_event=False,
    )


def sources_of(*triggers: str) -> tuple[str, ...]:
    """The states any of `triggers` may start from, in the enum's order."""
    found = {source for (source, trigger) in TABLE if trigger in triggers}
    return tuple(s.value for s in State if s.value in found)


def allowed_triggers(state: str | None) -> list[str]:
    """The triggers the table allows from `state` (for error messages and explain)."""
    return sorted(trigger for (source, trigger) in TABLE if source == state)


# The `Ledger` method of each command whose name differs: a refusal names both.
METHOD_BY_COMMAND = {
    "fail": "fail_stage",
    "recovered": "complete_recovery",
    "handoff": "hand_off",
    "trusted": "record_trusted_state",
    "untrust": "invalidate_trusted_state",
}


def command_name(command: str) -> str:
    """A command as the command line and the Python API both call it: `handoff (hand_off)`."""
    method = METHOD_BY_COMMAND.get(command)
    return command if method is None else f"{command} ({method})"


def allowed_commands(state: str | None) -> list[str]:
    """The commands a candidate in `state` accepts (for error messages, by `command_name`)."""
    commands = {COMMAND_BY_TRIGGER[t] for t in allowed_triggers(state)} - {_SETTING_CHANGE}
    return [command_name(c) for c in sorted(commands)]


def command_allowed(state: str | None, triggers: Iterable[str]) -> bool:
    """Whether the table allows any of `triggers` from `state`."""
    return state is not None and any((state, t) in TABLE for t in triggers)


def diagram(path: Sequence[tuple[str | None, str, str, int]] = ()) -> str:
    """The table as Mermaid `stateDiagram-v2` text; `path`, one candidate's moves `(from, trigger, to, seq)`,
    labels each edge it took with its seqs, shades the states it visited and outlines the last."""
    edges: dict[tuple[str, str], list[str]] = {}
    for (source, trigger), dest in TABLE.items():  # the initial triggers first: a new stream's edge
        edges.setdefault((source or "[*]", dest), []).append(trigger)
    taken: dict[tuple[str, str], list[int]] = {}
    for source, _trigger, dest, seq in path:
        taken.setdefault((source or "[*]", dest), []).append(seq)
    lines = ["stateDiagram-v2", "  direction LR", *(f"  {s.value}" for s in State)]
    for (source, dest), triggers in edges.items():
        lines.append(f"  {source} --> {dest}: {' | '.join(triggers)}{_taken(taken, source, dest)}")
    if path:
        visited = sorted({dest for _, _, dest, _ in path})
        lines += [
            "  classDef visited fill:#dbe9ff,stroke:#1f4e99",
            "  classDef current fill:#ffd966,stroke:#7f6000,stroke-width:3px",
            f"  class {','.join(visited)} visited",
            f"  class {path[-1][2]} current",
        ]
    return "\n".join(lines)


def _taken(taken: dict[tuple[str, str], list[int]], source: str, dest: str) -> str:
    seqs = taken.get((source, dest))
    if not seqs:
        return ""
    shown = ", ".join(str(s) for s in seqs[:3]) + (f" +{len(seqs) - 3} more" if len(seqs) > 3 else "")
    return f" (taken: seq {shown})"
