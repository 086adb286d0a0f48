"""The `lifecycle` script: `status ID`, the commonest read, answered without importing click.

click and the group (`app.main`) cost a `status ID` process ~50M of its ~264M instructions
(issue #13). This module recognises one narrow shape of command line,

    lifecycle [--db PATH | --db=PATH] [--json] status ID [--json]

with `LIFECYCLE_DB` and `LIFECYCLE_LOG_LEVEL` read as click reads them, stdout and stderr
UTF-8 text streams and stdout not a terminal; and does what the group would: the same
refusals (`guards`), the same read (`streams.query_work`), the same text (`render`), the
same `Error: …` lines and exit codes. Anything else — another command or option, `--help`,
a second ID, an argument starting with `-`, a variable click would validate
(`LIFECYCLE_SYNCHRONOUS`, `LIFECYCLE_SIGNING_KEY`, a bad `LIFECYCLE_LOG_LEVEL`), shell
completion — goes to click unchanged: click stays the CLI's one parser, and this path is
taken only where its answer is known to be click's (tests/test_entry.py runs both on the
same inputs and compares the bytes and exit codes).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["StatusRequest", "run", "status_request"]

_LOG_LEVELS = ("debug", "info", "warning", "error")  # the group's --log-level choices (case-sensitive)
_VALIDATED = ("LIFECYCLE_SYNCHRONOUS", "LIFECYCLE_SIGNING_KEY")  # click checks these: leave them to it


class StatusRequest(NamedTuple):
    """A command line this module answers itself."""

    db: str
    as_json: bool
    candidate_id: str
    log_level: str


def status_request(argv: Sequence[str], environ: Mapping[str, str]) -> StatusRequest | None:
    """`argv` as a `status ID` request, or None when click must parse it."""
    if any(environ.get(name) for name in _VALIDATED):
        return None
    if any(name.startswith("_") and name.endswith("_COMPLETE") for name in environ):
        return None  # shell completion
    log_level = environ.get("LIFECYCLE_LOG_LEVEL") or "warning"  # click: an empty variable is unset
    if log_level not in _LOG_LEVELS:
        return None
    if not all(arg.isprintable() for arg in argv):
        return None
    db = environ.get("LIFECYCLE_DB") or "lifecycle.db"
    as_json = given_db = False
    rest = list(argv)
    while rest and rest[0] != "status":
        arg = rest.pop(0)
        if arg == "--json":
            as_json = True
        elif arg == "--db" and rest and not given_db:
            db, given_db = rest.pop(0), True
        elif arg.startswith("--db=") and not given_db:
            db, given_db = arg.removeprefix("--db="), True
        else:
            return None
        if given_db and (not db or db.startswith("-")):
            return None
    ids = [arg for arg in rest[1:] if arg != "--json"]
    if not rest or len(ids) != 1 or ids[0].startswith("-") or not ids[0]:
        return None
    return StatusRequest(db, as_json or "--json" in rest, ids[0], log_level)


def _plain_streams() -> bool:
    """stdout and stderr are UTF-8 text streams and stdout is no terminal (click would write as `_write`)."""
    try:
        return not sys.stdout.isatty() and all(
            codecs.lookup(stream.encoding).name == "utf-8" for stream in (sys.stdout, sys.stderr)
        )
    except (AttributeError, LookupError, TypeError, ValueError):  # no stream, no encoding, a closed stream
        return False


def _write(text: str, *, err: bool = False) -> None:
    """`click.echo(text, err=err)` for a UTF-8 text stream that is not a terminal, where click
    writes the text, a newline, and flushes (it strips ANSI codes: `display` leaves none)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def run(prog_name: str | None = None) -> None:
    """The `lifecycle` command: `status ID` here when it can be, else the click group."""
    if sys.stdout is None:  # started with stdout closed: run nothing that could not report
        from lifecycle_fsm.cli.guards import closed_output

        if sys.stderr is not None:
            _write(f"Error: {closed_output('standard output is closed')}", err=True)
        sys.exit(3)
    request = status_request(sys.argv[1:], os.environ)
    if request is None or not _plain_streams():
        from lifecycle_fsm.cli import main

        main(prog_name=prog_name)
        return
    sys.exit(_status(request))


def _status(request: StatusRequest) -> int:
    """What `queries.status` does for one candidate, under the group's error handling."""
    from lifecycle_fsm.cli.exit_codes import exit_code_for
    from lifecycle_fsm.cli.guards import is_driver_error, refuse_empty_file, refuse_memory_db
    from lifecycle_fsm.cli.render import candidate_json, json_text, print_status, status_text
    from lifecycle_fsm.errors import LifecycleError
    from lifecycle_fsm.limits import display
    from lifecycle_fsm.logs import configure_logging
    from lifecycle_fsm.store.open import open_store
    from lifecycle_fsm.store.sqlite_errors import translate_sqlite_error
    from lifecycle_fsm.streams import StreamReader

    try:
        try:
            configure_logging(request.log_level)
            refuse_memory_db(request.db)
            refuse_empty_file(request.db)
            store = open_store(request.db, synchronous="FULL", create=False)
            try:
                doc = candidate_json(StreamReader(store).query(request.candidate_id))
                if request.as_json:
                    _write(json_text(doc))
                elif (text := status_text([doc])) is not None:
                    _write(text)
                else:  # a non-ASCII or very wide cell: rich lays it out (no click needed)
                    print_status([doc])
            finally:
                store.close()
        except LifecycleError as e:
            _write(f"Error: {display(str(e))}", err=True)
            return int(exit_code_for(e))
        except Exception as e:
            if not is_driver_error(e):
                raise
            error = translate_sqlite_error(e, request.db)
            _write(f"Error: {display(str(error))}", err=True)
            return int(exit_code_for(error))
    except KeyboardInterrupt:
        _write("", err=True)  # as click: a blank line closes the terminal's ^C echo
        _write("Error: interrupted", err=True)
        return 130  # ExitCode.INTERRUPTED (not imported: this path loads no more than it needs)
    except EOFError:
        _write("", err=True)
        _write("Error: aborted", err=True)
        return 1
    except OSError as e:
        if e.errno != errno.EPIPE:
            from lifecycle_fsm.cli.guards import closed_output

            if e.filename is not None:  # not stdout's: a file of ours
                raise
            _write(f"Error: {closed_output(e.strerror or str(e))}", err=True)
            return 3
        _quiet_broken_pipe()
        return 1
    return 0


def _quiet_broken_pipe() -> None:
    """The reader went away: exit 1 without a traceback or a flush error, as click does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
