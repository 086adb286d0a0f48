"""The `lifecycle` command line (click + rich): the composition root over the Ledger, the store and replay.

Commands parse, call the library and print; `--json` prints exactly one JSON document and a refusal
is one `Error: …` line on stderr with a documented exit code (`exit_codes.py`).
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
    """The `lifecycle` script: Ctrl-C while the modules load is `Error: interrupted` (exit 130), not a traceback."""
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
