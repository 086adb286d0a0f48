"""The `lifecycle` command line: a thin edge over the Ledger, the store and replay.

The composition root: the only package that imports the domain, the store and replay
together, the only one that imports click and rich, and the only one that configures
logging. Commands parse arguments, call the library and print; they hold no logic. With
`--json`, stdout is exactly one JSON document. Errors are one `Error: …` line on stderr
and a documented exit code (`exit_codes.py`).

Adding a command: write `cli/<concern>.py` with a `@click.command()` that imports what it
needs from `app` and `render`, import it below and add it to `main`. A command imports its
heavy modules inside its function, so `lifecycle status` does not pay for `audit` or `serve`.
"""

from __future__ import annotations

from lifecycle_fsm.cli.app import main
from lifecycle_fsm.cli.attest import attest
from lifecycle_fsm.cli.audit import audit
from lifecycle_fsm.cli.auditor import log, report
from lifecycle_fsm.cli.decisions import decisions
from lifecycle_fsm.cli.drill import drill
from lifecycle_fsm.cli.exit_codes import EXIT_CODES
from lifecycle_fsm.cli.integrity import checkpoint, hash_command, verify
from lifecycle_fsm.cli.migrate import migrate
from lifecycle_fsm.cli.queries import diagram, explain, history, replay, status, wait
from lifecycle_fsm.cli.serve import serve
from lifecycle_fsm.cli.trust import key, seal_command
from lifecycle_fsm.cli.writes import (
    baseline,
    check,
    evaluation,
    fail,
    handoff,
    init,
    receive,
    recovered,
    trusted,
    untrust,
    window,
)

__all__ = ["EXIT_CODES", "main"]

_WRITES = [init, baseline, window, evaluation, receive, check, trusted, untrust, fail, recovered, handoff]
_READS = [status, wait, history, explain, replay, diagram, checkpoint, verify, hash_command]
_OTHERS = [audit, drill, decisions, log, report, serve, migrate, key, seal_command, attest]
for _command in [*_WRITES, *_READS, *_OTHERS]:
    main.add_command(_command)
