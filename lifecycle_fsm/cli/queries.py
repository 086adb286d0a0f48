"""Commands that read the ledger and append nothing: status, wait, history, explain, replay, diagram."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from lifecycle_fsm.cli.app import AS_OF, SEQ, json_option, open_ledger, open_read_store, root_obj, wants_json
from lifecycle_fsm.cli.exit_codes import decision_exit_code
from lifecycle_fsm.cli.render import candidate_json, emit, print_history, print_status
from lifecycle_fsm.errors import WaitTimeout
from lifecycle_fsm.limits import display
from lifecycle_fsm.machine import State

if TYPE_CHECKING:
    from lifecycle_fsm.replay import LoadResult
    from lifecycle_fsm.replay.log import AsOf
    from lifecycle_fsm.state import CandidateState
    from lifecycle_fsm.store.records import StreamHead

__all__ = ["diagram", "explain", "history", "replay", "status", "wait"]


@click.command()
@click.argument("candidate_id", metavar="[ID]", required=False)
@click.option(
    "--as-of",
    type=AS_OF,
    help="The state then: after this seq (0: before the first event), or a time: before the first event after it.",
)
@json_option
def status(candidate_id: str | None, as_of: AsOf | None) -> None:
    """Every candidate's state (from the latest checkpoint + tail), or one candidate's; --as-of: then."""
    store = open_read_store()
    position = None
    if candidate_id is None:
        from lifecycle_fsm.replay import load_state
        from lifecycle_fsm.replay.log import position_of

        position = None if as_of is None else position_of(store, as_of)
        states = [c for _, c in sorted(load_state(store, to=position, checked=True).state.candidates.items())]
    elif as_of is None:
        from lifecycle_fsm.streams import StreamReader

        states = [StreamReader(store).query(candidate_id)]
    else:
        from lifecycle_fsm.events import stream_of
        from lifecycle_fsm.replay.log import not_yet, position_of
        from lifecycle_fsm.streams import fold_candidate

        then = position_of(store, as_of)
        one = fold_candidate([e for e in store.read_stream(stream_of(candidate_id)) if e.seq <= then])
        if one is None:
            raise not_yet(candidate_id, as_of, then)
        states = [one]
    _warn_stale_rules(states)
    docs = [candidate_json(c) for c in states]
    if wants_json():
        emit(docs if candidate_id is None else docs[0])
        return
    if position is not None:
        click.echo(f"as of seq {position}")
    print_status(docs)


def _warn_stale_rules(candidates: list[CandidateState]) -> None:
    """A warning on stderr for each candidate decided under rules that are not today's."""
    from lifecycle_fsm.state import stale_rules

    for c in candidates:
        if (recorded := stale_rules(c)) is not None:
            from lifecycle_fsm.replay.explanation_parts import rules_warning

            click.echo(display(f"warning: {c.candidate_id}: {rules_warning(c.candidate_id, recorded)}"), err=True)


def _states(ctx: click.Context, param: click.Parameter, given: tuple[str, ...]) -> tuple[State, ...]:
    """`--state ready,tune` (or the option repeated) as states; an unknown name is a usage error."""
    names = [name.strip() for value in given for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in State.__members__.values()]
    if unknown or not names:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown)) or 'nothing'} is not a state (one of {', '.join(State)})", ctx, param
        )
    return tuple(dict.fromkeys(State(name) for name in names))


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--state",
    "states",
    required=True,
    multiple=True,
    metavar="S[,S...]",
    callback=_states,
    help="The states to wait for (comma-separated, or the option repeated).",
)
@click.option("--timeout", required=True, type=float, metavar="SECONDS", help="How long to wait (0: look once).")
@click.option("--poll", default=0.2, show_default=True, type=float, metavar="SECONDS", help="How often to look.")
@json_option
def wait(candidate_id: str, states: tuple[State, ...], timeout: float, poll: float) -> None:
    """Block until ID is in one of the states (a candidate not received yet is waited for).

    Exit 0 when it is; 9 when the timeout passes first; 11 when it is rejected instead
    (reject is terminal: it can reach nothing else).
    """
    ledger = open_ledger(must_exist=True)
    ends = tuple(dict.fromkeys((*states, State.REJECT)))
    try:
        reached = ledger.wait_for(candidate_id, ends, timeout, poll=poll)
    except WaitTimeout as e:
        if wants_json():  # the same object as when a state was reached, with the last one seen (null: none)
            last = None if e.last_state is None else str(e.last_state)
            emit({"id": candidate_id, "state": last, "wanted": [str(s) for s in states], "reached": False})
        raise WaitTimeout(
            f"candidate {candidate_id!r} did not reach {' | '.join(states)} within {timeout:g} s "
            f"(last state: {e.last_state or 'not received'})",
            candidate_id=candidate_id,
            states=states,
            last_state=e.last_state,
        ) from None
    wanted = reached in states
    if wants_json():
        emit({"id": candidate_id, "state": str(reached), "wanted": [str(s) for s in states], "reached": wanted})
    else:
        click.echo(display(f"{candidate_id}: {reached}" + ("" if wanted else f" (not {' | '.join(states)})")))
    if not wanted:
        sys.exit(int(decision_exit_code("wait", reached)))


@click.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def history(candidate_id: str) -> None:
    """Every event of one candidate, oldest first."""
    print_history(open_ledger(must_exist=True).history(candidate_id))


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--as-of",
    type=AS_OF,
    help="Explain the state then: after this seq (0: before any), or before the first event recorded after this time.",
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
    from lifecycle_fsm.replay.explain import explanation
    from lifecycle_fsm.replay.explanation_parts import explain_markdown, explain_text

    found = explanation(open_read_store(), candidate_id, as_of=as_of)
    fmt = fmt or ("json" if wants_json() else "text")
    if fmt == "json":
        root_obj()["json"] = True
        emit(found.to_json())
    else:
        text = explain_markdown(found) if fmt == "md" else explain_text(found)
        click.echo(display(text, keep_newlines=True), nl=False)


@click.command()
@click.option("--to", type=SEQ, help="Replay only up to this global position (past the head: exit 3).")
@click.option(
    "--full",
    is_flag=True,
    help="Ignore checkpoints and rebuild the state index and the event index from the whole log.",
)
@json_option
def replay(to: int | None, full: bool) -> None:
    """Rebuild every candidate's state from the log (latest checkpoint + tail)."""
    from lifecycle_fsm.replay import index_of, load_state
    from lifecycle_fsm.replay.log import position_of

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
        from lifecycle_fsm.replay.explain import explanation

        steps = explanation(open_read_store(), candidate_id).path
        path = [(s.from_state, s.trigger, s.to, s.seq) for s in steps]
    from lifecycle_fsm.machine import diagram as mermaid_diagram

    text = mermaid_diagram(path)
    emit({"mermaid": text}) if wants_json() else click.echo(text)
