"""The `lifecycle` command line: a thin edge over the Ledger, the store and replay.

The composition root: the only package that imports the domain, the store and replay
together, the only one that imports click and rich, and the only one that configures
logging. Commands parse arguments, call the library and print; they hold no logic. With
`--json`, stdout is exactly one JSON document. Errors are one `Error: …` line on stderr
and a documented exit code (`exit_codes.py`).

Adding a command: write `cli/<concern>.py` with a `@click.command()` that imports what it
needs from `app` and `render`, and name it in `app.COMMANDS`. The group imports a command's
module only when that command runs, and a command imports its heavy modules inside its
function, so `lifecycle status` does not pay for `audit` or `serve`.
"""

from __future__ import annotations

import sys
import typing

from lifecycle_fsm.cli import exit_codes
from lifecycle_fsm.cli.exit_codes import EXIT_CODES

if typing.TYPE_CHECKING:
    from lifecycle_fsm.cli.app import main

__all__ = ["EXIT_CODES", "main", "run"]


def run() -> None:
    """The `lifecycle` script. Ctrl-C while the command line's modules load ends it as it does
    mid-command (`Error: interrupted`, exit 130), not with a traceback from an import."""
    try:
        from lifecycle_fsm.cli.app import main
    except KeyboardInterrupt:
        sys.stderr.write("Error: interrupted\n")
        raise SystemExit(int(exit_codes.ExitCode.INTERRUPTED)) from None
    main(prog_name="lifecycle")


def __getattr__(name: str) -> object:
    """`main`, the click group, loads click and the commands' modules only when asked for."""
    if name != "main":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from lifecycle_fsm.cli.app import main

    globals()["main"] = main
    return main
