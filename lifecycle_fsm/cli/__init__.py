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

from lifecycle_fsm.cli.app import main
from lifecycle_fsm.cli.exit_codes import EXIT_CODES

__all__ = ["EXIT_CODES", "main"]
