"""The candidate state machine: one declarative table, used live and on replay.

`MOVES` is the contract (SPEC §4): each row names the command a user types, the
trigger it fires, the states it may start from and where it leads. Everything else
is derived from it, never copied:
- `MACHINE`, one shared `transitions.Machine` (candidates are never added to it:
  a machine per candidate costs ~1 ms and ~39 KB) used to check live commands with
  `get_transitions`, which runs no callbacks; built on first use (`live_machine`), so
  a process that only reads and folds never imports `transitions`;
- `TABLE` / `TABLE_BY_STATE`, plain dicts for replay, ~50x cheaper than firing
  triggers and free of side effects;
- `COMMAND_TRIGGERS` (what a command may fire) and `sources_of` (e.g. the states an
  evidence invalidation reaches);
- `TABLE_DIGEST`, part of the checkpoint fingerprint (`snapshots.py`);
- `diagram()`, the Mermaid text of the same table.

A new stream starts with `receive` (no source state); `=` keeps the state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

if TYPE_CHECKING:
    from transitions import Machine

    MACHINE: Machine  # see `__getattr__` below

__all__ = [
    "COMMAND_BY_TRIGGER",
    "COMMAND_TRIGGERS",
    "INITIAL_TRIGGER",
    "REGISTER_TRIGGER",
    "MACHINE",
    "MOVES",
    "TABLE",
    "TABLE_BY_STATE",
    "TABLE_DIGEST",
    "TRANSITIONS",
    "Move",
    "State",
    "allowed_commands",
    "allowed_triggers",
    "command_allowed",
    "diagram",
    "live_machine",
    "next_state",
    "sources_of",
]


class State(StrEnum):
    """A candidate's lifecycle state; `reject` is terminal."""

    RECEIVED = "received"
    VERIFIED = "verified"
    RECOVERING = "recovering"
    TUNE = "tune"
    REJECT = "reject"
    READY = "ready"


class Move(NamedTuple):
    """One row of the table: `command` fires `trigger` from any of `sources` into `dest`.

    A named tuple, not an attrs class: a row of a constant table, read at import by every
    process (a read imports no attrs, issue #13).
    """

    command: str
    trigger: str
    sources: tuple[State, ...]
    dest: State | None  # None: the state is kept ("=")


S = State
_ALIVE = (S.RECEIVED, S.VERIFIED, S.RECOVERING, S.TUNE, S.READY)
_DECIDED = (S.VERIFIED, S.READY, S.TUNE)
_CAN_FAIL = (S.RECEIVED, S.VERIFIED, S.RECOVERING)
_SETTING_CHANGE = "baseline/evaluation/window change"

INITIAL_TRIGGER = "receive"
REGISTER_TRIGGER = "register"  # a candidate that exists before its adapter (a training run)

MOVES: tuple[Move, ...] = (
    Move("receive", "complete_registration", (S.RECEIVED,), None),  # the finished adapter of a registered one
    Move("receive", "revise", (S.TUNE,), S.RECEIVED),
    Move("check", "pass_checks", (S.RECEIVED,), S.VERIFIED),
    Move("check", "pass_checks", _DECIDED, None),  # a re-check: artifacts can change after a decision
    Move("check", "fail_checks", (S.RECEIVED, *_DECIDED), S.REJECT),
    Move("fail", "fail_stage", _CAN_FAIL, None),
    # After hand-off only artifact validation can fail (an export or merge): roll back or block the release.
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

# The same rows in the form `transitions` takes (plain strings).
TRANSITIONS: list[dict[str, Any]] = [
    {"trigger": m.trigger, "source": [s.value for s in m.sources], "dest": "=" if m.dest is None else m.dest.value}
    for m in MOVES
]

# The CLI command behind each trigger, so refusals speak the user's language.
COMMAND_BY_TRIGGER: dict[str, str] = {
    INITIAL_TRIGGER: "receive",
    REGISTER_TRIGGER: "register",
    **{m.trigger: m.command for m in MOVES},
}
# Every trigger a command may fire: the command is allowed where any of them is.
COMMAND_TRIGGERS: dict[str, frozenset[str]] = {
    command: frozenset(t for t, c in COMMAND_BY_TRIGGER.items() if c == command)
    for command in dict.fromkeys(COMMAND_BY_TRIGGER.values())
}


def _build_table() -> dict[tuple[str | None, str], str]:
    table: dict[tuple[str | None, str], str] = {
        (None, INITIAL_TRIGGER): State.RECEIVED.value,
        (None, REGISTER_TRIGGER): State.RECEIVED.value,
    }
    for move in MOVES:
        for source in move.sources:
            key = (source.value, move.trigger)
            if key in table:
                raise AssertionError(f"ambiguous transition {key}")
            table[key] = source.value if move.dest is None else move.dest.value
    return table


TABLE = _build_table()
# The same table as state -> {trigger -> next state}: replay's per-event look-up
# without building a tuple key.
TABLE_BY_STATE: dict[str | None, dict[str, str]] = {None: {}, **{s.value: {} for s in State}}
for (_source, _trigger), _dest in TABLE.items():
    TABLE_BY_STATE[_source][_trigger] = _dest
del _source, _trigger, _dest
TABLE_DIGEST = hashlib.sha256(
    orjson.dumps({"states": [s.value for s in State], "transitions": TRANSITIONS}, option=orjson.OPT_SORT_KEYS)
).hexdigest()

_MACHINE: list[Machine] = []  # the shared machine, once built


def live_machine() -> Machine:
    """The shared `transitions.Machine` of the table (also `machine.MACHINE`), built on first use.

    A read (`status ID`: fold and print) never needs it; importing `transitions` (and
    `logging`, `six`) was a tenth of that process.
    """
    if not _MACHINE:
        import logging

        from transitions import Machine

        # transitions logs every callback at INFO (~6x the cost of a trigger); we fire none,
        # but keep it quiet for embedders who log at INFO.
        logging.getLogger("transitions").setLevel(logging.WARNING)
        _MACHINE.append(
            Machine(
                model=None,
                states=[s.value for s in State],
                transitions=TRANSITIONS,
                initial=State.RECEIVED.value,
                auto_transitions=False,
                send_event=False,
            )
        )
    return _MACHINE[0]


def __getattr__(name: str) -> Any:
    """`MACHINE` is `live_machine()` (PEP 562: built when first named, not at import)."""
    if name == "MACHINE":
        return live_machine()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def next_state(state: str | None, trigger: str) -> str | None:
    """Where `trigger` leads from `state`, or None when the table forbids it."""
    return TABLE.get((state, trigger))


def sources_of(*triggers: str) -> tuple[str, ...]:
    """The states any of `triggers` may start from, in the enum's order."""
    found = {source for (source, trigger) in TABLE if trigger in triggers}
    return tuple(s.value for s in State if s.value in found)


def _machine_name(state: str) -> str:
    """`state` as the machine's own name: `transitions` takes an Enum member for its *name* (`READY`)."""
    return state.value if isinstance(state, State) else state


def allowed_triggers(state: str | None) -> list[str]:
    """The triggers the table allows from `state` (a `State` or its value; for error messages and explain)."""
    if state is None:
        return [INITIAL_TRIGGER, REGISTER_TRIGGER]
    state = _machine_name(state)
    machine = live_machine()
    return sorted({t for t in machine.get_triggers(state) if machine.get_transitions(t, source=state)})


def allowed_commands(state: str | None) -> list[str]:
    """The CLI commands a candidate in `state` accepts (for error messages)."""
    commands = {COMMAND_BY_TRIGGER[t] for t in allowed_triggers(state)}
    commands.discard(_SETTING_CHANGE)
    return sorted(commands)


def command_allowed(state: str | None, triggers: Iterable[str]) -> bool:
    """Whether the shared machine allows any of `triggers` from `state` (runs no callbacks)."""
    if state is None:
        return False
    source = _machine_name(state)
    return any(live_machine().get_transitions(t, source=source) for t in triggers)


def diagram(path: Sequence[tuple[str | None, str, str, int]] = ()) -> str:
    """The table as Mermaid `stateDiagram-v2` text, drawn by transitions itself.

    `path` marks one candidate's moves, `(from, trigger, to, seq)` in order: each edge
    it took is labelled with the seqs that took it, the states it visited are shaded
    and the state it ended in is outlined.
    """
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
    lines = [line for line in text.splitlines() if not line.strip().startswith(("classDef ", "Class "))]
    return "\n".join(_marked(lines, path) if path else lines)


def _marked(lines: list[str], path: Sequence[tuple[str | None, str, str, int]]) -> list[str]:
    """The diagram's lines with one candidate's path marked (see `diagram`)."""
    taken: dict[tuple[str, str], list[int]] = {}
    for source, _trigger, dest, seq in path:
        taken.setdefault((source or "[*]", dest), []).append(seq)
    out = []
    for line in lines:
        edge, _, label = line.strip().partition(": ")
        source, arrow, dest = edge.partition(" --> ")
        seqs = taken.get((source, dest)) if arrow else None
        if seqs:
            shown = ", ".join(str(s) for s in seqs[:3]) + (f" +{len(seqs) - 3} more" if len(seqs) > 3 else "")
            out.append(f"  {source} --> {dest}: {label or INITIAL_TRIGGER} (taken: seq {shown})")
        else:
            out.append(line)
    visited = sorted({dest for _, _, dest, _ in path})
    out += ["  classDef visited fill:#dbe9ff,stroke:#1f4e99",
            "  classDef current fill:#ffd966,stroke:#7f6000,stroke-width:3px",
            f"  class {','.join(visited)} visited", f"  class {path[-1][2]} current"]  # fmt: skip
    return out
