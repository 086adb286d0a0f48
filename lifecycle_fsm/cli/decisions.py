"""`lifecycle decisions export DIR` / `decisions replay DIR`: the decision pool (`lifecycle_fsm.decision_pool`).

`replay` exits 8 when a decision would change: the gate for a rules change.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import click

from lifecycle_fsm.cli.app import SuggestingGroup, json_option, open_ledger, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.limits import display

__all__ = ["decisions", "export", "replay"]


@click.group(cls=SuggestingGroup)
def decisions() -> None:
    """The decision pool: every check, hand-off and recovery plan as a file, re-decidable without a ledger."""


@decisions.command("export")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@json_option
def export(folder: Path) -> None:
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
def replay(folder: Path) -> None:
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
