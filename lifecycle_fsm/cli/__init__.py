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

Adding a command is one new module and one line here: write `cli/<concern>.py` with a
`@click.command()` (or `@click.group()`) that imports what it needs from `app` and
`render` (never from this file, so nothing is circular), import the module below and
add `main.add_command(<module>.<command>)`. Tests then require that it is reachable from
`main` (a forgotten line fails), that its `--help` works, that README.md names it, and
that the module's `__all__` lists what it defines.
"""

from __future__ import annotations

from lifecycle_fsm.cli import audit, auditor, decisions, drill, integrity, migrate, queries, serve, writes
from lifecycle_fsm.cli.app import main
from lifecycle_fsm.cli.exit_codes import EXIT_CODES

__all__ = ["EXIT_CODES", "main"]

main.add_command(writes.init)
main.add_command(writes.baseline)
main.add_command(writes.window)
main.add_command(writes.evaluation)
main.add_command(writes.receive)
main.add_command(writes.check)
main.add_command(writes.trusted)
main.add_command(writes.untrust)
main.add_command(writes.fail)
main.add_command(writes.recovered)
main.add_command(writes.handoff)
main.add_command(queries.status)
main.add_command(queries.history)
main.add_command(queries.explain)
main.add_command(queries.replay)
main.add_command(queries.diagram)
main.add_command(integrity.checkpoint)
main.add_command(integrity.verify)
main.add_command(integrity.hash_command)
main.add_command(audit.audit)
main.add_command(drill.drill)
main.add_command(decisions.decisions)
main.add_command(auditor.log)
main.add_command(auditor.report)
main.add_command(serve.serve)
main.add_command(migrate.migrate)
