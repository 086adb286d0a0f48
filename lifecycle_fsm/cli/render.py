"""How the CLI shows things: one JSON document with `--json`, rich tables otherwise."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import orjson

from lifecycle_fsm.cli.app import wants_json
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display

if TYPE_CHECKING:  # rich is imported when a table is printed
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from lifecycle_fsm.events import Event
    from lifecycle_fsm.results import CommandResult
    from lifecycle_fsm.state import CandidateState
    from lifecycle_fsm.store.records import StoredEvent

__all__ = ["NO_CHANGE", "candidate_json", "cells", "console", "emit", "print_history", "print_result", "print_status"]

# What a write command's text adds when it appended nothing (a no-op, or a retried `--event-id`).
NO_CHANGE = " (no change: nothing appended)"


def emit(doc: Any) -> None:
    """Write exactly one JSON document to stdout."""
    click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())


def candidate_json(c: CandidateState) -> JSON:
    """The public shape of a candidate's state (`status`, `replay`)."""
    return {
        "id": c.candidate_id,
        "kind": c.kind,
        "state": str(c.state),
        "version": c.version,
        "revision": c.revision,
        "reason_codes": list(c.reason_codes),
        "decisive_seq": c.decisive_seq,
        "last_seq": c.last_seq,
        "trusted_states": sorted(c.trusted_states),
    }


def print_result(result: CommandResult, verb: str) -> None:
    """A command's outcome: what it appended and where the candidate (or ledger) stands."""
    from lifecycle_fsm.results import CandidateResult  # only the commands that append print results

    doc: JSON = {"appended": result.appended, "events": [e.seq for e in result.events]}
    if isinstance(result, CandidateResult):
        doc |= candidate_json(result.candidate) | {"inconclusive": result.inconclusive}
        what = f"{display(result.candidate_id)}: {verb}, state {result.state}"
        if result.candidate.reason_codes:
            what += f" ({', '.join(result.candidate.reason_codes)})"
        if result.inconclusive:
            what += "; inconclusive: an artifact could not be read (see `explain`), nothing was decided"
        invalidated: tuple[str, ...] = ()
    else:
        doc["settings"] = result.settings.summary()
        doc["invalidated"] = list(result.invalidated)
        what, invalidated = verb, result.invalidated
    if wants_json():
        emit(doc)
        return
    if not doc["appended"]:
        what += NO_CHANGE
    click.echo(what)
    for cid in invalidated:
        click.echo(f"  evidence invalidated: {display(cid)} -> received")


def console() -> Console:
    """A terminal gets rich's own width; a pipe or a file gets room for whole hashes and ids."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=240)


def _table(*columns: str) -> Table:
    """A table that wraps long cells instead of cutting them: an auditor needs every character."""
    from rich.table import Column, Table

    return Table(*(Column(name, overflow="fold") for name in columns))


def cells(*values: str) -> list[Text]:
    """Table cells as plain text: an id is never rich markup (`[/x]` would raise) nor a terminal escape."""
    from rich.text import Text

    return [Text(display(v)) for v in values]


def print_status(docs: list[JSON]) -> None:
    if not docs:
        click.echo("no candidates")
        return
    table = _table("id", "kind", "state", "version", "reasons")
    for d in docs:
        kind = "none" if d["kind"] is None else str(d["kind"])
        table.add_row(*cells(d["id"], kind, d["state"], str(d["version"]), ", ".join(d["reason_codes"])))
    console().print(table)


def print_history(rows: list[tuple[StoredEvent, Event]]) -> None:
    if wants_json():
        from lifecycle_fsm.replay.log import event_json

        emit([event_json(s, e.to_payload(), stream=False) for s, e in rows])
        return
    table = _table("seq", "type", "trigger", "recorded_at", "actor")
    for s, e in rows:
        table.add_row(*cells(str(s.seq), s.type, str(getattr(e, "trigger", "")), s.recorded_at, s.actor))
    console().print(table)
