"""Commands that read the ledger and show state: status, history, explain, replay, diagram.

They append nothing. Whole-ledger views come from `replay` (latest checkpoint + tail);
one candidate's from the `Ledger`.
"""

from __future__ import annotations

import click

from lifecycle_fsm.cli.app import json_option, open_ledger, wants_json
from lifecycle_fsm.cli.render import candidate_json, emit, print_explain, print_history, print_status
from lifecycle_fsm.machine import diagram as mermaid_diagram
from replay import LoadResult, index_of, load_state
from replay import explain as explain_candidate
from store.records import StreamHead

__all__ = ["diagram", "explain", "history", "replay", "status"]


@click.command()
@click.argument("candidate_id", metavar="[ID]", required=False)
@json_option
def status(candidate_id: str | None) -> None:
    """Every candidate's state (from the latest checkpoint + tail), or one candidate's."""
    ledger = open_ledger(must_exist=True)
    if candidate_id is not None:
        doc = candidate_json(ledger.candidate(candidate_id))
        emit(doc) if wants_json() else print_status([doc])
        return
    states = load_state(ledger.store).state.candidates
    docs = [candidate_json(c) for _, c in sorted(states.items())]
    emit(docs) if wants_json() else print_status(docs)


@click.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def history(candidate_id: str) -> None:
    """Every event of one candidate, oldest first."""
    print_history(open_ledger(must_exist=True).history(candidate_id), wants_json())


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.option("--as-of", type=click.IntRange(min=1), help="Explain the state as of this global position.")
@json_option
def explain(candidate_id: str, as_of: int | None) -> None:
    """Why ID is in its state: reason codes and the decisive event's evidence."""
    doc = explain_candidate(open_ledger(must_exist=True).store, candidate_id, as_of=as_of)
    emit(doc) if wants_json() else print_explain(doc)


@click.command()
@click.option("--to", "to", type=click.IntRange(min=0), help="Replay only up to this global position.")
@click.option("--full", is_flag=True, help="Ignore checkpoints and rebuild the state index from the whole log.")
@json_option
def replay(to: int | None, full: bool) -> None:
    """Rebuild every candidate's state from the log (latest checkpoint + tail)."""
    ledger = open_ledger(must_exist=True)
    if full and to is None:
        # Fold and rebuild under the write lock, so no append lands in between.
        results: list[LoadResult] = []

        def derive() -> list[StreamHead]:
            results.append(load_state(ledger.store, use_checkpoints=False))
            return index_of(results[0].state)

        ledger.store.rebuild_stream_index(derive)
        loaded = results[0]
    else:
        loaded = load_state(ledger.store, to=to, use_checkpoints=not full)
    docs = [candidate_json(c) for _, c in sorted(loaded.state.candidates.items())]
    doc = {
        "states": docs,
        "checkpoint": None if loaded.checkpoint is None else loaded.checkpoint.position,
        "position": loaded.state.position,
        "skipped_checkpoints": [{"checkpoint_id": cid, "reason": why} for cid, why in loaded.skipped],
    }
    if wants_json():
        emit(doc)
        return
    start = "the beginning" if loaded.checkpoint is None else f"checkpoint at seq {loaded.checkpoint.position}"
    click.echo(f"replayed from {start} to seq {loaded.state.position}")
    for cid, why in loaded.skipped:
        click.echo(f"skipped checkpoint {cid}: {why}")
    print_status(docs)


@click.command()
@json_option
def diagram() -> None:
    """The state machine as Mermaid text."""
    text = mermaid_diagram()
    emit({"mermaid": text}) if wants_json() else click.echo(text)
