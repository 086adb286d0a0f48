"""The auditor's desk: `log` (the filtered log, printed as its rows are read, or its tail as it grows),
`report` (a document to hand over, written as audit records are: atomic, one `.previous` with `--replace`)
and the decision pool (`decisions export`, `decisions replay`: exit 8 when a decision would change).
"""

from __future__ import annotations

import collections
import errno
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from lifecycle_fsm.cli.app import AS_OF, TIME, SuggestingGroup, closed_output, json_option, open_ledger, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import MAX_INT64, display

if TYPE_CHECKING:
    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.replay.log import AsOf

__all__ = ["decisions", "decisions_export", "decisions_replay", "log", "report"]

_Row = tuple[Any, JSON]  # a stored event and its decoded payload


@click.command()
@click.option("--after", type=click.IntRange(0, MAX_INT64), default=0, help="Only events after this seq (exclusive).")
@click.option("--before", type=click.IntRange(1, MAX_INT64), help="Only events before this seq (exclusive).")
@click.option("--since", type=TIME, help="Only events recorded at or after this ISO 8601 time.")
@click.option("--until", type=TIME, help="Only events recorded at or before this ISO 8601 time.")
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
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Then keep printing new events as they are appended (filters apply) until Ctrl-C, which exits 0.",
)
@click.option(
    "--poll", type=float, default=0.2, show_default=True, metavar="SECONDS", help="--follow: how often to look."
)
@json_option
def log(follow: bool, poll: float, jsonl: bool, **filters: Any) -> None:
    """Events across every stream, filtered; each shaped as in `history --json` (plus stream_id).

    Filters combine (all must hold). Page through a long log with `--limit N`, then
    `--after` the last seq shown. `--follow` works with the text and `--jsonl` output.
    """
    from lifecycle_fsm.replay.log import known_stream, log_filter, read_log

    if jsonl and wants_json():
        raise click.UsageError("--json asks for one JSON array and --jsonl for one object per line: give one of them")
    if follow and wants_json():
        raise click.UsageError("--follow prints events as they come, which one JSON array cannot: use --jsonl")
    query = log_filter(**filters)
    ledger = open_ledger(must_exist=True)
    if not follow:
        with known_stream(ledger.store, query, filters["stream"]), _output_errors():  # an unknown --stream: exit 4
            if wants_json():
                _print_array(read_log(ledger.store, query))
            elif _print_rows(read_log(ledger.store, query), jsonl) == 0 and not jsonl:
                click.echo("no events match")
        return
    try:
        with _output_errors():
            _follow(ledger, filters, poll=poll, jsonl=jsonl)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a follow ends, whenever it comes: not an interruption to report


@contextmanager
def _output_errors() -> Iterator[None]:
    """Rows go to stdout as they are read: a full disk or a closed stdout is one line, as for `echo`."""
    try:
        yield
    except OSError as e:
        if e.errno == errno.EPIPE or e.filename is not None or isinstance(e, LifecycleError):
            raise  # a StoreError is an OSError too: the rows are read as they are printed
        raise closed_output(e.strerror or str(e)) from e


def _follow(ledger: Ledger, filters: JSON, *, poll: float, jsonl: bool) -> None:
    """The log up to the head seen now, then each new stretch of it that matches, until `--before` or
    `--limit` (or Ctrl-C); each stretch in its own snapshot, so a follower never holds one open."""
    from lifecycle_fsm.events import candidate_id_of
    from lifecycle_fsm.replay.log import known_stream, log_filter, read_log

    limit, before, after, stream = filters["limit"], filters["before"] or MAX_INT64, filters["after"], filters["stream"]
    head = ledger.store.head().seq
    shown = 0
    with known_stream(ledger.store, log_filter(**filters), stream):
        pass  # an unknown --stream is refused (exit 4) before the first byte
    woken_by = candidate_id_of(stream) or stream if stream else None  # what `Ledger.follow` calls a stream
    stretches = ledger.follow(head, poll, stream=woken_by)
    while (limit is None or shown < limit) and after < before - 1:
        end = min(head, before - 1)
        if end > after:
            stretch = filters | {"after": after, "before": end + 1, "limit": None if limit is None else limit - shown}
            shown += _print_rows(read_log(ledger.store, log_filter(**stretch)), jsonl)
            after = end
        if (limit is not None and shown >= limit) or after >= before - 1:
            return  # met by what was there already: never wait for an event it would not print
        event = next(stretches, None)  # the next event: then read on to the head
        if event is None:  # the ledger was closed
            return
        head = max(event.seq, ledger.store.head().seq)


def _print_rows(rows: Iterable[_Row], jsonl: bool) -> int:
    """Each row on its own line (text or JSON), flushed as it comes; how many were printed."""
    from lifecycle_fsm.replay.log import event_json, event_reasons

    shown = 0
    for event, payload in rows:
        if jsonl:
            line = orjson.dumps(event_json(event, payload)).decode()
        else:
            reasons = ",".join(event_reasons(event, payload))
            tags = f"  [{reasons}]" if reasons else ""
            # an actor's newline or escape is spelled out: one event, one line
            line = display(
                f"{event.seq:>8}  {event.recorded_at}  {event.stream_id}  {event.type}{tags}  by {event.actor}"
            )
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        shown += 1
    return shown


def _print_array(rows: Iterable[_Row]) -> None:
    """One JSON array, read whole first: a row refused midway leaves stdout empty."""
    from lifecycle_fsm.replay.log import event_json

    items = [orjson.dumps(event_json(event, payload)).decode() for event, payload in rows]
    body = "".join(("\n  " if n == 0 else ",\n  ") + item for n, item in enumerate(items))
    sys.stdout.write("[" + body + "\n]\n")


_REPORT_FORMATS = {"md": "ledger-report.md", "html": "ledger-report.html"}


@click.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder for the report (created if missing).",
)
@click.option("--format", "fmt", type=click.Choice(sorted(_REPORT_FORMATS)), default="md", show_default=True)
@click.option("--replace", is_flag=True, help="Move an existing report to <file>.previous first (one generation).")
@click.option(
    "--as-of",
    type=AS_OF,
    help="The ledger then: after this seq (0: before any event), or a time: before the first event after it.",
)
@json_option
def report(out: Path, fmt: str, replace: bool, as_of: AsOf | None) -> None:
    """Write ledger-report.md (or .html): head, verify result and seals, candidates by state, rejections
    with their evidence, recoveries, the machine and each candidate's path.

    Self-contained (no network needed to read it) and byte-stable for the same ledger
    (and the same --as-of position). An existing report is refused (exit 3) unless
    --replace. The whole log is verified, --as-of or not; if verify fails, the report
    is still written, says so at the top, and the command exits 6.
    """
    from lifecycle_fsm.audit_records import publish, refuse_existing
    from lifecycle_fsm.replay.report import build_report, report_html, report_markdown

    target = out / _REPORT_FORMATS[fmt]
    refuse_existing([target], replace, what="a report", hint="another --out, or ")  # before the (slow) verify
    doc = build_report(open_ledger(must_exist=True).store, as_of=as_of)
    text = report_markdown(doc) if fmt == "md" else report_html(doc)
    moved = publish([(target, text.encode("utf-8"))], replace=replace)
    verified = doc.verify.ok
    if wants_json():
        emit(
            {
                "path": str(target),
                "format": fmt,
                "verified": verified,
                "head": doc.head,
                "as_of": doc.as_of,
                "replaced": [str(p) for p in moved],
            }
        )
    else:
        for previous in moved:
            click.echo(f"previous report kept as {previous}")
        then = "" if doc.as_of is None else f", as of seq {doc.as_of}"
        click.echo(f"report: {target} (head seq {doc.head['seq']}{then}, verify {'ok' if verified else 'FAILED'})")
    if not verified:
        sys.exit(int(ExitCode.INTEGRITY))


@click.group(cls=SuggestingGroup)
def decisions() -> None:
    """The decision pool: every check, hand-off and recovery plan as a file, re-decidable without a ledger."""


@decisions.command("export")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@json_option
def decisions_export(folder: Path) -> None:
    """Write one JSON file per recorded decision into FOLDER (new or empty).

    Export each ledger into a folder of its own; `decisions replay` reads every `*.json`
    under the folder it is given, sub-folders too, so the parent of several exports is
    one pool.
    """
    from lifecycle_fsm.decision_pool import export_pool

    written = export_pool(open_ledger(must_exist=True).store, folder)
    counted = dict(sorted(collections.Counter(p.stem.split("-", 1)[1] for p in written).items()))
    if wants_json():
        emit({"folder": str(folder), "files": len(written), "decisions": counted})
    else:
        counts = ", ".join(f"{n} {k}" for k, n in counted.items()) or "no decisions"
        click.echo(display(f"{len(written)} decision files in {folder} ({counts})"))


@decisions.command("replay")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@json_option
def decisions_replay(folder: Path) -> None:
    """Re-decide every *.json under FOLDER (sub-folders too) with today's rules; exit 8 if any would change."""
    from lifecycle_fsm.decision_pool import replay_pool

    total, changed = replay_pool(folder)
    if wants_json():
        changes = [
            {
                "file": c.file,
                "candidate_id": c.state.candidate_id,
                "seq": c.state.seq,
                "decision": c.state.decision,
                "recorded": c.state.decided,
                "now": c.now,
            }
            for c in changed
        ]
        emit({"ok": not changed, "decisions": total, "changed": changes})
    else:
        for c in changed:
            click.echo(display(f"changed: {c.line()}"))  # a pool file's id is one line, whatever it holds
        click.echo(f"{total} decisions re-decided, {len(changed)} would change")
    if changed:
        sys.exit(int(ExitCode.DRILL_FAILED))
