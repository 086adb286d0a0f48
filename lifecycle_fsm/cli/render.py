"""How the CLI shows things: one JSON document with `--json`, rich tables otherwise.

It imports neither click nor rich until it prints (`echo`, `console`): the `lifecycle`
script's click-free `status ID` (`entry.py`) builds its text here and writes it itself.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from lifecycle_fsm.limits import display

if TYPE_CHECKING:  # rich is imported when a table is printed, not at start-up (~30 ms); the rest are types
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from lifecycle_fsm.events import Event
    from lifecycle_fsm.results import CommandResult
    from lifecycle_fsm.state import CandidateState
    from lifecycle_fsm.store.records import StoredEvent

__all__ = [
    "NO_CHANGE",
    "PIPE_WIDTH",
    "candidate_json",
    "cells",
    "console",
    "echo",
    "emit",
    "json_text",
    "plain_table",
    "print_history",
    "print_result",
    "print_status",
    "status_text",
    "work_json",
]

_JSON = dict[str, Any]

# What a write command's text adds when it appended nothing (a no-op, or a retried `--event-id`
# reporting the first outcome): every write command says it the same way.
NO_CHANGE = " (no change: nothing appended)"


def echo(text: str, *, err: bool = False) -> None:
    """`click.echo` (imported here: every command but the script's fast `status ID` has it already)."""
    import click

    click.echo(text, err=err)


def json_text(doc: Any) -> str:
    """The one JSON document `emit` writes."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()


def emit(doc: Any) -> None:
    """Write exactly one JSON document to stdout."""
    echo(json_text(doc))


def candidate_json(c: CandidateState) -> _JSON:
    """The public shape of a candidate's state (`status`, `replay`)."""
    return work_json({**attrs.asdict(c, recurse=False), "state": c.state.value})


def work_json(work: Mapping[str, Any]) -> _JSON:
    """`candidate_json` of the fold's working dict (`CandidateState.to_work`, `streams.query_work`)."""
    return {
        "id": work["candidate_id"],
        "kind": work["kind"],
        "state": work["state"],
        "version": work["version"],
        "revision": work["revision"],
        "reason_codes": list(work["reason_codes"]),
        "decisive_seq": work["decisive_seq"],
        "last_seq": work["last_seq"],
        "trusted_states": sorted(work["trusted_states"]),
    }


def print_result(result: CommandResult, as_json: bool, verb: str) -> None:
    """A command's outcome: what it appended and where the candidate (or ledger) stands."""
    from lifecycle_fsm.results import CandidateResult  # only the commands that append print results

    doc: _JSON = {"appended": result.appended, "events": [e.seq for e in result.events]}
    if isinstance(result, CandidateResult):
        doc |= candidate_json(result.candidate)
        what = f"{display(result.candidate_id)}: {verb}, state {result.state}"
        if result.candidate.reason_codes:
            what += f" ({', '.join(result.candidate.reason_codes)})"
        invalidated: tuple[str, ...] = ()
    else:
        doc["settings"] = result.settings.summary()
        doc["invalidated"] = list(result.invalidated)
        what, invalidated = verb, result.invalidated
    if as_json:
        emit(doc)
        return
    if not doc["appended"]:
        what += NO_CHANGE
    echo(what)
    for cid in invalidated:
        echo(f"  evidence invalidated: {display(cid)} -> received")


def console() -> Console:
    """A terminal gets rich's own width; a pipe or a file gets room for whole hashes and ids."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def _table(*columns: str) -> Table:
    """A table that wraps long cells instead of cutting them: an auditor needs every character."""
    from rich.table import Table

    table = Table()
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def cells(*values: str) -> list[Text]:
    """Table cells as plain text: an id is never rich markup (`[/x]` would raise) nor a terminal escape."""
    from rich.text import Text

    return [Text(display(v)) for v in values]


PIPE_WIDTH = 240  # `console()`'s width for a pipe or a file


def plain_table(columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str | None:
    """The text rich prints for this table into a pipe (`console()`, `_table`), drawn without
    importing rich (~40 ms of a `status` process); None when rich's own layout is needed:
    a terminal (colours, its width), a non-ASCII cell (cell widths), or a table wider than
    the pipe (folded cells). tests/test_render_plain.py holds it to rich's output."""
    if sys.stdout.isatty():
        return None
    texts = [columns, *[tuple(display(v) for v in row) for row in rows]]
    if not all(v.isascii() for row in texts for v in row):
        return None
    widths = [max(len(row[i]) for row in texts) for i in range(len(columns))]
    if sum(widths) + 3 * len(widths) + 1 > PIPE_WIDTH:
        return None

    def line(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def cells_line(bar: str, row: tuple[str, ...]) -> str:
        return bar + bar.join(f" {v.ljust(w)} " for v, w in zip(row, widths, strict=True)) + bar

    out = [line("┏", "━", "┳", "┓"), cells_line("┃", columns), line("┡", "━", "╇", "┩")]
    out += [cells_line("│", row) for row in texts[1:]]
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out)


_STATUS_COLUMNS = ("id", "kind", "state", "version", "reasons")


def _status_rows(docs: list[_JSON]) -> list[tuple[str, ...]]:
    return [
        (
            d["id"],
            "none" if d["kind"] is None else str(d["kind"]),
            d["state"],
            str(d["version"]),
            ", ".join(d["reason_codes"]),
        )
        for d in docs
    ]


def status_text(docs: list[_JSON]) -> str | None:
    """What `print_status` echoes without rich (`plain_table`), or None when it needs rich."""
    return "no candidates" if not docs else plain_table(_STATUS_COLUMNS, _status_rows(docs))


def print_status(docs: list[_JSON]) -> None:
    if (text := status_text(docs)) is not None:
        echo(text)
        return
    table = _table(*_STATUS_COLUMNS)
    for row in _status_rows(docs):
        table.add_row(*cells(*row))
    console().print(table)


def print_history(rows: list[tuple[StoredEvent, Event]], as_json: bool) -> None:
    if as_json:
        emit(
            [
                {
                    "seq": s.seq,
                    "version": s.version,
                    "type": s.type,
                    "recorded_at": s.recorded_at,
                    "actor": s.actor,
                    "event_id": s.event_id,
                    "payload": e.to_payload(),
                }
                for s, e in rows
            ]
        )
        return
    table = _table("seq", "type", "trigger", "recorded_at", "actor")
    for s, e in rows:
        table.add_row(*cells(str(s.seq), s.type, str(getattr(e, "trigger", "")), s.recorded_at, s.actor))
    console().print(table)
