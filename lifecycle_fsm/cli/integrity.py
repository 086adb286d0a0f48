"""Commands that prove things: `verify` the log (a finding exits 6 after its report), `checkpoint`, `hash`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lifecycle_fsm.cli.app import json_option, open_ledger, open_read_store, root_obj, signing_key, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON

if TYPE_CHECKING:
    from lifecycle_fsm.artifacts import TreeDigest

__all__ = ["checkpoint", "hash_command", "verify"]


@click.command()
@json_option
def checkpoint() -> None:
    """Snapshot every folded state at the head, for fast loading; with a signing key, seal the head too."""
    from lifecycle_fsm.ledger import utc_now
    from lifecycle_fsm.replay import take_checkpoint
    from lifecycle_fsm.seals import seal, sealable_head

    key = signing_key()  # a bad key is refused before anything is written
    ledger = open_ledger(must_exist=True)
    checked = None if key is None else sealable_head(ledger.store, key)  # refused: no checkpoint either
    record = take_checkpoint(ledger.store, clock=utc_now)
    doc: JSON = {"checkpoint_id": record.checkpoint_id, "position": record.position, "head_hash": record.head_hash}
    if key is not None:
        doc["signed_head"] = seal(ledger.store, key, actor=ledger.actor, clock=utc_now, checked=checked)
    if wants_json():
        emit(doc)
        return
    click.echo(f"checkpoint {record.checkpoint_id} at seq {record.position}")
    if signed := doc.get("signed_head"):
        click.echo(f"sealed head seq {signed['seq']} (key {signed['key_id'][:16]})")


@click.command()
@click.option(
    "--expect-head",
    "expect_heads",
    multiple=True,
    metavar="FILE|SEQ:HASH",
    help="A head kept elsewhere (a `seal` file, or SEQ:HASH: a seq from 1, 64 lowercase hex): the ledger must hold it.",
)
@click.option(
    "--pubkey",
    "pubkeys",
    multiple=True,
    type=click.Path(),
    metavar="FILE",
    help="A trusted public key (repeatable): every seal must be signed by one of them.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes sharing the work: each re-hashes a slice of the log and replays a share of the streams.",
)
@json_option
def verify(expect_heads: tuple[str, ...], pubkeys: tuple[str, ...], jobs: int) -> None:
    """Re-hash the chain, check every checkpoint, seal and pinned head, replay every transition. Exit 6 if broken."""
    from lifecycle_fsm.keys import PublicKeys
    from lifecycle_fsm.pins import parse_expected_head
    from lifecycle_fsm.replay import verify as verify_ledger
    from lifecycle_fsm.seals import add_trust_findings

    heads = [parse_expected_head(value) for value in expect_heads]  # bad input: exit 3 before reading
    keys = PublicKeys.from_files(pubkeys)
    store = open_read_store()
    with store.read_snapshot():  # the seals and pinned heads judged against the same log as the chain
        report = add_trust_findings(store, verify_ledger(store, workers=jobs, target=root_obj()["db"]), heads, keys)
    if wants_json():
        emit(report)
    elif report["ok"]:
        click.echo(f"ok: {report['events']} events, head seq {report['head']['seq']} {report['head']['hash']}")
        if n := report["seals"]["count"]:
            # ok with keys given: every seal's signature was checked (one that failed would have failed verify)
            checked = f"{n} signature{'s' * (n != 1)} checked" if keys else "signatures not checked (no --pubkey)"
            click.echo(f"seals: {n}, last at seq {report['seals']['last_seq']}, {checked}")
    else:
        for found in report["problems"]:  # every finding, the first one first
            reason = f"{found['reason']} ({found['advice']})" if found.get("advice") else found["reason"]
            detail = f" ({found['message']})" if found.get("message") else ""
            # The state index or an append-only guard is not an event: there is no seq to name.
            at = f" at seq {found['bad_seq']}" if found["bad_seq"] is not None else ""
            click.echo(f"BROKEN{at}: {reason}{detail}")
    if not report["ok"]:
        sys.exit(int(ExitCode.INTEGRITY))


@click.command("hash")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--root", type=click.Path(path_type=Path), help="Symlinks may point anywhere inside ROOT (a folder).")
@json_option
def hash_command(path: Path, root: Path | None) -> None:
    """The sha256 that manifests record for a file or a directory."""
    from lifecycle_fsm.artifact_paths import folder_problem

    if root is not None and (problem := folder_problem(root)):
        raise InputError(f"--root {root} {problem}")  # bad input (exit 3), not "path escapes root"
    digest = _hash_with_progress(path, root)
    if wants_json():  # a directory's digest is no `sha256sum` output: the algorithm names its format
        emit({"path": str(path), "sha256": digest.sha256, "algorithm": digest.algorithm})
    else:
        click.echo(f"{digest.sha256}  {path}")


def _hash_with_progress(path: Path, root: Path | None) -> TreeDigest:
    """Hash, with a progress bar for trees of 64 MiB or more when a person is watching."""
    from lifecycle_fsm.artifacts import hash_tree, tree_size

    watched = not wants_json() and sys.stderr.isatty() and os.path.isdir(path)
    total = tree_size(path, root) if watched else 0
    if total < 64 * 1024 * 1024:
        return hash_tree(path, root, max_listed=0)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task(f"hashing {path}", total=total)
        return hash_tree(path, root, progress=lambda n: progress.advance(task, n), max_listed=0)
