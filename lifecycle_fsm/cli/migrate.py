"""`lifecycle migrate SRC DST`: copy a ledger between any two backends (`store.migrate`), with a progress bar."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from lifecycle_fsm.cli.app import json_option, refuse_empty_file, refuse_memory_db, root_obj, wants_json
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.store.open import describe_target, is_postgres_url, open_store

if TYPE_CHECKING:
    from lifecycle_fsm.store.base import EventStore
    from lifecycle_fsm.store.migrate import Progress

__all__ = ["migrate"]


def _same(a: str, b: str) -> bool:
    if is_postgres_url(a) or is_postgres_url(b):
        return a == b
    return os.path.realpath(a) == os.path.realpath(b)


@contextmanager
def _progress(total: int) -> Iterator[Progress | None]:
    """A rich progress bar on stderr when a person is watching; nothing otherwise."""
    if wants_json() or not sys.stderr.isatty() or total == 0:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress as Bar

    with Bar(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("verifying and copying events", total=total)
        yield lambda done, _: bar.update(task, completed=done)


@click.command()
@click.argument("src")
@click.argument("dst")
@json_option
def migrate(src: str, dst: str) -> None:
    """Copy every event and checkpoint of the ledger SRC into DST (files or postgresql:// URLs).

    The chain is verified as it is copied; afterwards `verify --json` gives the same
    head on both. A DST that already holds events must be a prefix of SRC: the copy
    resumes after it (an identical DST copies nothing). Anything else is refused (exit 5).
    A broken SRC chain stops the copy (exit 6), saying what was copied; a DST file this
    command created is removed again if nothing was copied into it (or it could not even
    be created whole, as on a full disk: exit 7).
    """
    from lifecycle_fsm.replay import index_of
    from lifecycle_fsm.state import Fold
    from lifecycle_fsm.store.chain import fold_columns
    from lifecycle_fsm.store.migrate import migrate as copy_ledger

    if _same(src, dst):
        raise InputError("SRC and DST are the same ledger")
    refuse_memory_db(dst, "DST")  # a copy into memory would vanish with the command
    refuse_empty_file(src, allow_empty=True)  # a folder, a FIFO or a device is no ledger: said before any driver error
    refuse_empty_file(dst, allow_empty=True)  # DST may be an empty file (an empty database)
    synchronous = root_obj()["synchronous"]
    source = open_store(src, synchronous=synchronous, create=False)
    click.get_current_context().call_on_close(source.close)
    new_files = _missing_files(dst)
    try:
        target = open_store(dst, synchronous=synchronous)
    except BaseException:  # e.g. a full disk while creating it: the file this run made holds nothing yet
        _remove(new_files)
        raise
    click.get_current_context().call_on_close(target.close)
    # One fold of the rows as the copy walks them: a move the machine forbids stops the copy there, and
    # the fold is the destination's state index (its rows are byte-identical copies).
    folding = Fold(whole_log=True)
    try:
        with _progress(source.head().seq) as progress:
            report = copy_ledger(
                source,
                target,
                index=lambda _: index_of(folding.result()),
                check=lambda rows: folding.extend(map(fold_columns, rows)),
                progress=progress,
            )
    except BaseException:
        _remove_if_empty(target, dst, new_files)
        raise
    skipped = report.skipped_checkpoints
    if wants_json():
        emit(
            {
                "source": describe_target(src),
                "destination": describe_target(dst),
                "copied": report.copied,
                "already_present": report.already_present,
                "checkpoints": report.checkpoints,
                "checkpoints_present": report.checkpoints_present,
                "skipped_checkpoints": [{"checkpoint_id": c, "reason": why} for c, why in skipped],
                "head": {"seq": report.head.seq, "hash": report.head.hash},
            }
        )
        return
    click.echo(
        f"copied {report.copied} events ({report.already_present} already there) and {report.checkpoints} "
        f"checkpoints ({report.checkpoints_present} already there) to {describe_target(dst)}"
    )
    for checkpoint_id, why in skipped:
        click.echo(f"skipped checkpoint {checkpoint_id}: {why}")
    click.echo(f"head seq {report.head.seq} {report.head.hash}")


def _missing_files(dst: str) -> list[str]:
    """The files of a SQLite DST that do not exist yet (none for a database URL: a server's schema is left alone)."""
    if is_postgres_url(dst):
        return []
    return [p for p in (dst, f"{dst}-wal", f"{dst}-shm", f"{dst}-journal") if not os.path.lexists(p)]


def _remove_if_empty(target: EventStore, dst: str, new_files: list[str]) -> None:
    """After a failed copy, remove the ledger file this run created when it provably holds no event."""
    if dst not in new_files:
        return
    try:
        empty = target.head().seq == 0
    except LifecycleError:  # cannot tell: keep the file
        return
    if empty:
        target.close()
        _remove(new_files)


def _remove(new_files: list[str]) -> None:
    for path in new_files:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
