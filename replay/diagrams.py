"""The report's Mermaid flowcharts: the machine, and one candidate's path through it.

The machine is drawn from the table (`machine.MOVES`) as a flowchart rather than a
state diagram: each pair of states gets one edge, its triggers stacked in the label,
and the moves that keep a state are listed in the node itself, so no loop label
lands on another edge. Hand-off outcomes are coloured alike everywhere: ready green,
tune amber, reject red, recovering blue.
"""

from __future__ import annotations

from collections.abc import Sequence

from lifecycle_fsm.machine import INITIAL_TRIGGERS, MOVES, State
from lifecycle_fsm.replay.explanation_parts import PathStep

__all__ = ["MAX_PATH_MOVES", "STATE_STYLES", "machine_flowchart", "path_flowchart"]

MAX_PATH_MOVES = 60  # a path diagram shows the last moves of a very long life
STATE_STYLES = {
    State.READY: "fill:#d7f0d8,stroke:#2e7d32,color:#1b5e20",
    State.TUNE: "fill:#fff1c2,stroke:#b38600,color:#5c4400",
    State.REJECT: "fill:#fbd5d5,stroke:#c62828,color:#7f1010",
    State.RECOVERING: "fill:#dce9f7,stroke:#1e5aa8,color:#0d3266",
}


def _styles() -> list[str]:
    return [f"  classDef {state.value} {style}" for state, style in STATE_STYLES.items()]


def machine_flowchart() -> str:
    """The transition table as a top-down flowchart: one edge per pair of states, loops inside the nodes."""
    edges: dict[tuple[State, State], list[str]] = {}
    stays: dict[State, list[str]] = {state: [] for state in State}
    for move in MOVES:
        for source in move.sources:
            if move.dest is None or move.dest is source:
                stays[source].append(move.trigger)
            else:
                edges.setdefault((source, move.dest), []).append(move.trigger)
    lines = ["flowchart TB", '  start(["new candidate"])']
    for state in State:
        kept = f"<br/><small>stays on: {', '.join(dict.fromkeys(stays[state]))}</small>" if stays[state] else ""
        lines.append(f'  {state.value}["<b>{state.value}</b>{kept}"]')
    lines.append(f'  start -->|"{"<br/>".join(INITIAL_TRIGGERS)}"| {State.RECEIVED.value}')
    for (source, dest), triggers in edges.items():
        lines.append(f'  {source.value} -->|"{"<br/>".join(triggers)}"| {dest.value}')
    lines += _styles()
    lines += [f"  class {state.value} {state.value}" for state in STATE_STYLES]
    return "\n".join(lines)


def path_flowchart(path: Sequence[PathStep]) -> str:
    """One candidate's moves as a left-to-right flowchart (state-changing events only), each state coloured."""
    moves = [s for s in path if s.from_state != s.to]
    lines = ["flowchart LR", '  s0(["start"])']
    skipped = max(0, len(moves) - MAX_PATH_MOVES)
    if skipped:
        lines[1] = f'  s0(["... {skipped} earlier moves"])'
    shown = moves[skipped:]
    for n, step in enumerate(shown, start=1):
        lines.append(f'  s{n - 1} -->|"{step.trigger} (seq {step.seq})"| s{n}["{step.to}"]')
    if shown:
        lines += _styles()
        coloured = {state.value for state in STATE_STYLES}
        lines += [f"  class s{n} {step.to}" for n, step in enumerate(shown, start=1) if step.to in coloured]
        lines.append(f"  class s{len(shown)} current")
        lines.append("  classDef current stroke-width:3px")
    return "\n".join(lines)
