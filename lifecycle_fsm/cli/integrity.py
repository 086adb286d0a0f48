"""Commands that prove things: `verify` the log, `checkpoint` it, `hash` an artifact.

`verify` is the one command whose exit code reports a finding rather than a refusal:
a broken chain or checkpoint exits 6 after printing the report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from lifecycle_fsm.artifacts import hash_directory, tree_size
from lifecycle_fsm.cli.app import json_option, open_ledger, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.ledger import utc_now
from replay import take_checkpoint
from replay import verify as verify_ledger

__all__ = ["checkpoint", "hash_command", "verify"]


@click.command()
@json_option
def checkpoint() -> None:
    """Snapshot every folded state at the head, for fast loading."""
    record = take_checkpoint(open_ledger(must_exist=True).store, clock=utc_now)
    doc = {"checkpoint_id": record.checkpoint_id, "position": record.position, "head_hash": record.head_hash}
    emit(doc) if wants_json() else click.echo(f"checkpoint {record.checkpoint_id} at seq {record.position}")


@click.command()
@json_option
def verify() -> None:
    """Re-hash the chain, check every checkpoint, replay every transition. Exit 6 if broken."""
    report = verify_ledger(open_ledger(must_exist=True).store)
    if wants_json():
        emit(report)
    elif report["ok"]:
        click.echo(f"ok: {report['events']} events, head seq {report['head']['seq']} {report['head']['hash']}")
    elif report.get("bad_seq") is not None:
        click.echo(f"BROKEN at seq {report['bad_seq']}: {report['reason']}")
    else:  # a checkpoint (or the state index), not an event: there is no seq to name
        click.echo(f"BROKEN: {report['reason']}")
    if not report["ok"]:
        sys.exit(int(ExitCode.INTEGRITY))


@click.command("hash")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), help="Symlinks may point anywhere inside ROOT."
)
@json_option
def hash_command(path: Path, root: Path | None) -> None:
    """The sha256 that manifests record for a file or a directory."""
    digest = _hash_with_progress(path, root)
    if wants_json():
        emit({"path": str(path), "sha256": digest, "algorithm": "sha256"})
    else:
        click.echo(f"{digest}  {path}")


def _hash_with_progress(path: Path, root: Path | None) -> str:
    """Hash, with a progress bar on stderr for large trees when a person is watching."""
    if wants_json() or not sys.stderr.isatty() or not os.path.isdir(path):
        return hash_directory(path, root)
    total = tree_size(path, root)
    if total < 64 * 1024 * 1024:
        return hash_directory(path, root)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task(f"hashing {path}", total=total)
        return hash_directory(path, root, progress=lambda n: progress.advance(task, n))
