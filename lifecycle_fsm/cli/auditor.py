"""The auditor's desk (SPEC §11): `log` (the filtered log) and `report` (a document to hand over).

`log` streams: the store runs one indexed query and rows are printed as they come,
so a million-event ledger answers `--limit 20` at once and never builds a list in
memory (`--json` writes one array element by element). `report` builds its document
in `replay.report` and writes it as `records.publish` writes audit records (atomic,
one `.previous` generation with `--replace`).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import orjson

from lifecycle_fsm.audit_records import publish, refuse_existing
from lifecycle_fsm.cli.app import TimeType, json_option, open_ledger, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.guards import closed_output
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.limits import MAX_INT64, display
from lifecycle_fsm.replay.log import event_json, event_reasons, known_stream, log_filter, read_log

__all__ = ["log", "report"]

_TIME = TimeType()


@click.command()
@click.option("--after", type=click.IntRange(0, MAX_INT64), default=0, help="Only events after this seq (exclusive).")
@click.option("--before", type=click.IntRange(1, MAX_INT64), help="Only events before this seq (exclusive).")
@click.option("--since", type=_TIME, help="Only events recorded at or after this ISO 8601 time.")
@click.option("--until", type=_TIME, help="Only events recorded at or before this ISO 8601 time.")
@click.option("--type", "types", multiple=True, metavar="TYPE", help="Only this event type (repeatable: any of them).")
@click.option(
    "--stream", metavar="ID", help="Only this candidate's events (or `ledger`, `seals`); an unknown id: exit 4."
)
@click.option("--actor", help="Only events recorded by this actor.")
@click.option("--reason", metavar="CODE", help="Only events whose evidence carries this reason code.")
@click.option(
    "--limit", type=click.IntRange(0, MAX_INT64), help="Only the first N (in seq order); page on with --after."
)
@click.option("--jsonl", is_flag=True, help="One JSON object per line (instead of --json's array).")
@json_option
def log(
    after: int,
    before: int | None,
    since: str | None,
    until: str | None,
    types: tuple[str, ...],
    stream: str | None,
    actor: str | None,
    reason: str | None,
    limit: int | None,
    jsonl: bool,
) -> None:
    """Events across every stream, filtered; each shaped as in `history --json` (plus stream_id).

    Filters combine (all must hold). Page through a long log with `--limit N`, then
    `--after` the last seq shown.
    """
    if jsonl and wants_json():
        raise click.UsageError("--json asks for one JSON array and --jsonl for one object per line: give one of them")
    query = log_filter(after=after, before=before, since=since, until=until, types=types, stream=stream,
                       actor=actor, reason=reason, limit=limit)  # fmt: skip
    store = open_ledger(must_exist=True).store
    with known_stream(store, query, stream):  # an unknown --stream is refused before the first byte
        rows = read_log(store, query)
        try:
            _print_log(rows, jsonl)
        except OSError as e:  # rows go to stdout as they come: a full disk is one line, as for `echo`
            if e.errno == errno.EPIPE or e.filename is not None or isinstance(e, LifecycleError):
                raise  # a StoreError is an OSError too: the rows are read as they are printed
            raise closed_output(e.strerror or str(e)) from e


def _print_log(rows: Iterable[tuple[Any, Any]], jsonl: bool) -> None:
    out = sys.stdout
    if jsonl:
        for event, payload in rows:
            out.write(orjson.dumps(event_json(event, payload)).decode() + "\n")
    elif wants_json():  # one document: read whole first, so a row refused midway leaves stdout empty
        items = [orjson.dumps(event_json(event, payload)).decode() for event, payload in rows]
        out.write("[" + "".join(("\n  " if n == 0 else ",\n  ") + item for n, item in enumerate(items)) + "\n]\n")
    else:
        shown = 0
        for event, payload in rows:
            reasons = ",".join(event_reasons(event, payload))
            line = (f"{event.seq:>8}  {event.recorded_at}  {event.stream_id}  {event.type}"
                    f"{'  [' + reasons + ']' if reasons else ''}  by {event.actor}")  # fmt: skip
            out.write(display(line) + "\n")  # one event, one line: an actor's newline or escape is spelled out
            shown += 1
        if shown == 0:
            click.echo("no events match")


_REPORT_FORMATS = {"md": "ledger-report.md", "html": "ledger-report.html"}


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Folder for the report (created if missing).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(sorted(_REPORT_FORMATS)), default="md", show_default=True)
@click.option("--replace", is_flag=True, help="Move an existing report to <file>.previous first (one generation).")
@json_option
def report(out: Path, fmt: str, replace: bool) -> None:
    """Write ledger-report.md (or .html): head, verify result and seals, candidates by state, rejections
    with their evidence, recoveries, the machine and each candidate's path.

    Self-contained (no network needed to read it) and byte-stable for the same ledger.
    An existing report is refused (exit 3) unless --replace. If verify fails, the report
    is still written, says so at the top, and the command exits 6.
    """
    from lifecycle_fsm.replay.report import build_report, report_html, report_markdown

    target = out / _REPORT_FORMATS[fmt]
    refuse_existing(
        [target], replace, what="a report", hint="another --out, or "
    )  # before the (slow) verify: a refusal is immediate
    doc = build_report(open_ledger(must_exist=True).store)
    text = report_markdown(doc) if fmt == "md" else report_html(doc)
    moved = publish([(target, text.encode("utf-8"))], replace=replace)
    summary = {"path": str(target), "format": fmt, "verified": doc["verify"]["ok"], "head": doc["head"],
               "replaced": [str(p) for p in moved]}  # fmt: skip
    if wants_json():
        emit(summary)
    else:
        for previous in moved:
            click.echo(f"previous report kept as {previous}")
        click.echo(
            f"report: {target} (head seq {doc['head']['seq']}, verify {'ok' if doc['verify']['ok'] else 'FAILED'})"
        )
    if not doc["verify"]["ok"]:
        sys.exit(int(ExitCode.INTEGRITY))
