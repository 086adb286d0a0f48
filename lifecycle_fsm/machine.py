"""The candidate state machine: one declarative table, used live and on replay.

`TRANSITIONS` is the contract (SPEC §4). From it we build:
- `MACHINE`, one shared `transitions.Machine` (candidates are never added to it:
  a machine per candidate costs ~1 ms and ~39 KB) used to check live commands with
  `get_transitions`, which runs no callbacks;
- `TABLE`, a plain dict `(state, trigger) -> next state` for replay, ~50x cheaper
  than firing triggers and free of side effects;
- `FINGERPRINT`, so a checkpoint folded under another table is never trusted;
- `diagram()`, the Mermaid text of the same table.

A new stream starts with `receive` (no source state); `=` keeps the state.
"""

from __future__ import annotations

import hashlib
import logging
from enum import StrEnum
from typing import Any

import orjson
from transitions import Machine

__all__ = [
    "COMMAND_BY_TRIGGER",
    "FINGERPRINT",
    "INITIAL_TRIGGER",
    "MACHINE",
    "TABLE",
    "TABLE_BY_STATE",
    "TRANSITIONS",
    "State",
    "allowed_commands",
    "allowed_triggers",
    "diagram",
    "next_state",
]

# transitions logs every callback at INFO (~6x the cost of a trigger); we fire none,
# but keep it quiet for embedders who log at INFO.
logging.getLogger("transitions").setLevel(logging.WARNING)


class State(StrEnum):
    """A candidate's lifecycle state; `reject` is terminal."""

    RECEIVED = "received"
    VERIFIED = "verified"
    RECOVERING = "recovering"
    TUNE = "tune"
    REJECT = "reject"
    READY = "ready"


_ALIVE = ["received", "verified", "recovering", "tune", "ready"]
_DECIDED = ["verified", "ready", "tune"]
_CAN_FAIL = ["received", "verified", "recovering"]

INITIAL_TRIGGER = "receive"

TRANSITIONS: list[dict[str, Any]] = [
    {"trigger": "revise", "source": ["tune"], "dest": "received"},
    {"trigger": "pass_checks", "source": ["received"], "dest": "verified"},
    {"trigger": "pass_checks", "source": _DECIDED, "dest": "="},
    {"trigger": "fail_checks", "source": ["received", *_DECIDED], "dest": "reject"},
    {"trigger": "fail_stage", "source": _CAN_FAIL, "dest": "="},
    {"trigger": "plan_recovery", "source": _CAN_FAIL, "dest": "recovering"},
    {"trigger": "block_recovery", "source": _CAN_FAIL, "dest": "reject"},
    {"trigger": "complete_recovery", "source": ["recovering"], "dest": "received"},
    {"trigger": "hand_off_ready", "source": ["verified"], "dest": "ready"},
    {"trigger": "hand_off_tune", "source": ["verified"], "dest": "tune"},
    {"trigger": "hand_off_reject", "source": ["verified"], "dest": "reject"},
    {"trigger": "invalidate_evidence", "source": _DECIDED, "dest": "received"},
    {"trigger": "record_trusted_state", "source": _ALIVE, "dest": "="},
    {"trigger": "invalidate_trusted_state", "source": _ALIVE, "dest": "="},
]


# The CLI command behind each trigger, so refusals speak the user's language.
COMMAND_BY_TRIGGER = {
    "receive": "receive",
    "revise": "receive",
    "pass_checks": "check",
    "fail_checks": "check",
    "fail_stage": "fail",
    "plan_recovery": "fail",
    "block_recovery": "fail",
    "complete_recovery": "recovered",
    "hand_off_ready": "handoff",
    "hand_off_tune": "handoff",
    "hand_off_reject": "handoff",
    "invalidate_evidence": "baseline/evaluation/window change",
    "record_trusted_state": "trusted",
    "invalidate_trusted_state": "untrust",
}


def allowed_commands(state: str | None) -> list[str]:
    """The CLI commands a candidate in `state` accepts (for error messages)."""
    commands = {COMMAND_BY_TRIGGER[t] for t in allowed_triggers(state)}
    commands.discard(COMMAND_BY_TRIGGER["invalidate_evidence"])
    return sorted(commands)


def _build_table() -> dict[tuple[str | None, str], str]:
    table: dict[tuple[str | None, str], str] = {(None, INITIAL_TRIGGER): State.RECEIVED.value}
    for t in TRANSITIONS:
        for source in t["source"]:
            key = (source, t["trigger"])
            if key in table:
                raise AssertionError(f"ambiguous transition {key}")
            table[key] = source if t["dest"] == "=" else t["dest"]
    return table


TABLE = _build_table()
# The same table as state -> {trigger -> next state}: replay's per-event look-up
# without building a tuple key.
TABLE_BY_STATE: dict[str | None, dict[str, str]] = {None: {}, **{s.value: {} for s in State}}
for (source, trigger), dest in TABLE.items():
    TABLE_BY_STATE[source][trigger] = dest
del source, trigger, dest
FINGERPRINT = hashlib.sha256(
    orjson.dumps({"states": [s.value for s in State], "transitions": TRANSITIONS}, option=orjson.OPT_SORT_KEYS)
).hexdigest()

MACHINE = Machine(
    model=None,
    states=[s.value for s in State],
    transitions=TRANSITIONS,
    initial=State.RECEIVED.value,
    auto_transitions=False,
    send_event=False,
)


def next_state(state: str | None, trigger: str) -> str | None:
    """Where `trigger` leads from `state`, or None when the table forbids it."""
    return TABLE.get((state, trigger))


def allowed_triggers(state: str | None) -> list[str]:
    """The triggers the table allows from `state` (for error messages and explain)."""
    if state is None:
        return [INITIAL_TRIGGER]
    return sorted({t for t in MACHINE.get_triggers(state) if MACHINE.get_transitions(t, source=state)})


def diagram() -> str:
    """The table as Mermaid `stateDiagram-v2` text, drawn by transitions itself."""
    from transitions.extensions import GraphMachine

    # A throw-away machine that is its own model: GraphMachine with model=None
    # raises IndexError (LIBRARY_NOTES).
    graph = GraphMachine(
        states=[s.value for s in State],
        transitions=TRANSITIONS,
        initial=State.RECEIVED.value,
        auto_transitions=False,
        graph_engine="mermaid",
        title="candidate lifecycle",
    )
    text = str(graph.get_graph().draw(None))
    # Drop the styling of the throw-away model's "current" state: the table has none.
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(("classDef ", "Class ")))
