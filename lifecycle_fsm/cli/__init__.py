"""The `lifecycle` command line: a thin edge over the Ledger, the store and replay.

The composition root: the only package that imports `lifecycle_fsm`, `store` and
`replay` together, the only one that imports click and rich, and the only one that
configures logging. `import lifecycle_fsm` does not import it. Commands parse
arguments, call the library and print; they hold no logic. With `--json`, stdout is
exactly one JSON document. Errors are one `Error: …` line on stderr and a documented
exit code (`EXIT_CODES`; the error classes know nothing of codes, `exit_codes` maps them).

    app.py         the `main` group, global options (--db, --json, …), shared helpers
                   (`open_ledger`, `json_option`, `wants_json`, `root_obj`)
    exit_codes.py  the documented codes and the error class → code table
    render.py      output: `emit` (one JSON document), rich tables, text lines
    writes.py      commands that append: init, baseline, window, evaluation, receive,
                   check, trusted, untrust, fail, recovered, handoff
    queries.py     commands that read: status, history, explain, replay, diagram
    integrity.py   checkpoint, verify, hash
    audit.py       audit (SPEC §7)
    auditor.py     log, report (SPEC §11)
    serve.py       serve: Datasette over a ledger snapshot (extra `ui`)
    drill.py       drill (SPEC §12)
    migrate.py     migrate (SPEC §9): copy a ledger between backends
    trust.py       key new, seal (SPEC §8: signed heads)
    attest.py      attest ID, attest verify (SPEC §8: DSSE hand-off attestations)

    entry.py       the `lifecycle` script: `status ID` read without click, the rest to `main`
    guards.py      the refusals before a ledger is opened (`:memory:`, an empty file)

Adding a command is one new module and one line here: write `cli/<concern>.py` with a
`@click.command()` (or `@click.group()`) that imports what it needs from `app` and
`render` (never from this file, so nothing is circular) and name its commands in
`_COMMANDS` below (`"name"`, or `"name:attribute"` when they differ). Modules are
imported when one of their commands runs (`lazy.py`), so `lifecycle status ID` does not
pay for `audit`, `drill` or `serve`. Tests then require that it is reachable from
`main` (a forgotten line fails), that its `--help` works, that README.md names it, and
that the module's `__all__` lists what it defines.

`main` and `EXIT_CODES` load on first use (PEP 562): importing this package imports no
click, so `entry` can answer `lifecycle status ID` without it.
"""

from __future__ import annotations

import sys
import typing

if typing.TYPE_CHECKING:
    from lifecycle_fsm.cli.app import main
    from lifecycle_fsm.cli.exit_codes import EXIT_CODES

__all__ = ["EXIT_CODES", "main"]

# module -> the commands it defines ("name" or "name:attribute"); a module is imported
# the first time one of its commands is used (`lazy.py`).
_COMMANDS = {
    "writes": ("init", "baseline", "window", "evaluation", "receive", "check", "trusted", "untrust", "fail",
               "recovered", "handoff"),
    "queries": ("status", "history", "explain", "replay", "diagram"),
    "integrity": ("checkpoint", "verify", "hash:hash_command"),
    "audit": ("audit",),
    "drill": ("drill",),
    "decisions": ("decisions",),
    "auditor": ("log", "report"),
    "serve": ("serve",),
    "migrate": ("migrate",),
    "trust": ("key", "seal:seal_command"),
    "attest": ("attest",),
}  # fmt: skip


def _where() -> dict[str, tuple[str, str]]:
    """command name -> (module, attribute): `app` hands it to `lazy.LazyCommands` as the group's table."""
    table = {}
    for module, commands in _COMMANDS.items():
        for entry in commands:
            name, _, attribute = entry.partition(":")
            table[name] = (f"lifecycle_fsm.cli.{module}", attribute or name)
    return table


def __getattr__(name: str) -> typing.Any:
    """`main` (the click group, with its command table) and `EXIT_CODES`, imported on first use."""
    where = {"main": "lifecycle_fsm.cli.app", "EXIT_CODES": "lifecycle_fsm.cli.exit_codes"}.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(where)
    value = getattr(sys.modules[where], name)
    globals()[name] = value
    return value
