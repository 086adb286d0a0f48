"""Commands that read the ledger and show state: status, history, explain, replay, diagram.

They append nothing. Whole-ledger views come from `replay` (latest checkpoint + tail);
one candidate's from the `Ledger`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from lifecycle_fsm.cli.app import AS_OF, SEQ, json_option, open_ledger, open_read_store, root_obj, wants_json
from lifecycle_fsm.cli.render import candidate_json, emit, print_history, print_status
from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.limits import display
from lifecycle_fsm.machine import diagram as mermaid_diagram
from lifecycle_fsm.store.records import StreamHead
from lifecycle_fsm.streams import StreamReader, fold_candidate

if TYPE_CHECKING:  # replay is imported by the commands that use it: `status ID` does not (start-up)
    from lifecycle_fsm.replay import LoadResult
    from lifecycle_fsm.replay.asof import AsOf

__all__ = ["diagram", "explain", "history", "replay", "status"]


@click.command()
@click.argument("candidate_id", metavar="[ID]", required=False)
@click.option(
    "--as-of", type=AS_OF, help="The state then: after this seq (from 1), or every event recorded by this time."
)
@json_option
def status(candidate_id: str | None, as_of: AsOf | None) -> None:
    """Every candidate's state (from the latest checkpoint + tail), or one candidate's; --as-of: then."""
    store = open_read_store()  # a read: no Ledger, so none of its command path is imported (start-up)
    position = None
    if as_of is not None:
        from lifecycle_fsm.replay.asof import position_of

        position = position_of(store, as_of)
    if candidate_id is not None:
        if position is None:
            doc = candidate_json(StreamReader(store).query(candidate_id))
        else:
            events = [e for e in store.read_stream(stream_of(candidate_id)) if e.seq <= position]
            state = fold_candidate(events)
            if state is None:
                raise NotFoundError(f"unknown candidate: {candidate_id!r} at or before seq {position}")
            doc = candidate_json(state)
        emit(doc) if wants_json() else print_status([doc])
        return
    from lifecycle_fsm.replay import load_state

    states = load_state(store, to=position, checked=True).state.candidates
    docs = [candidate_json(c) for _, c in sorted(states.items())]
    if not wants_json() and position is not None:
        click.echo(f"as of seq {position}")
    emit(docs) if wants_json() else print_status(docs)


@click.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def history(candidate_id: str) -> None:
    """Every event of one candidate, oldest first."""
    print_history(open_ledger(must_exist=True).history(candidate_id), wants_json())


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--as-of",
    type=AS_OF,
    help="Explain the state then: after this seq (from 1), or every event recorded by this time.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "md"]), help="Output format (default text; --json: json)."
)
@json_option
def explain(candidate_id: str, as_of: AsOf | None, fmt: str | None) -> None:
    """Why ID is in its state: every check's claimed and checked-against values, the decisive event, the path.

    A seq past the head exits 3; a position before the candidate existed exits 4.
    """
    if fmt not in (None, "json") and wants_json():
        raise click.UsageError(f"--json asks for JSON and --format {fmt} for {fmt}: give one of them")
    from lifecycle_fsm.replay import explain as explain_candidate
    from lifecycle_fsm.replay.explain_text import explain_markdown, explain_text

    doc = explain_candidate(open_read_store(), candidate_id, as_of=as_of)
    fmt = fmt or ("json" if wants_json() else "text")
    if fmt == "json":
        root_obj()["json"] = True
        emit(doc)
    else:
        click.echo(display(explain_markdown(doc) if fmt == "md" else explain_text(doc), keep_newlines=True), nl=False)


@click.command()
@click.option("--to", "to", type=SEQ, help="Replay only up to this global position (past the head: exit 3).")
@click.option("--full", is_flag=True, help="Ignore checkpoints and rebuild the state index from the whole log.")
@json_option
def replay(to: int | None, full: bool) -> None:
    """Rebuild every candidate's state from the log (latest checkpoint + tail)."""
    from lifecycle_fsm.replay import index_of, load_state
    from lifecycle_fsm.replay.asof import position_of

    ledger = open_ledger(must_exist=True)
    if to is not None:
        position_of(ledger.store, to, option="--to")  # a seq past the head is refused, as `--as-of` refuses it
    if full and to is None:
        # Fold and rebuild under the write lock, so no append lands in between.
        results: list[LoadResult] = []

        def derive() -> list[StreamHead]:
            results.append(load_state(ledger.store, use_checkpoints=False, checked=True))
            return index_of(results[0].state)

        ledger.store.rebuild_stream_index(derive)
        loaded = results[0]
    else:
        loaded = load_state(ledger.store, to=to, use_checkpoints=not full, checked=True)
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
@click.argument("candidate_id", metavar="[ID]", required=False)
@json_option
def diagram(candidate_id: str | None) -> None:
    """The state machine as Mermaid text; with ID, that candidate's path marked on it."""
    path: list[tuple[str | None, str, str, int]] = []
    if candidate_id is not None:
        from lifecycle_fsm.replay import explain as explain_candidate

        steps = explain_candidate(open_read_store(), candidate_id)["path"]
        path = [(s["from"], s["trigger"], s["to"], s["seq"]) for s in steps]
    text = mermaid_diagram(path)
    emit({"mermaid": text}) if wants_json() else click.echo(text)
