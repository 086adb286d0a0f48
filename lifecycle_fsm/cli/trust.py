"""Keys and seals: `key new`, `seal`.

`verify --expect-head/--pubkey` lives with `verify` (`integrity.py`), `attest` in
`attest.py`. A command that needs a key and has none exits 3 with nothing appended.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

import click

from lifecycle_fsm.cli.app import OutputFile, SuggestingGroup, json_option, open_ledger, require_signing_key, wants_json
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.cli.writes import event_id_option
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.limits import display
from lifecycle_fsm.outputs import StagedFile, stage

__all__ = ["key", "key_new", "seal_command"]


@click.group(cls=SuggestingGroup)
def key() -> None:
    """Ed25519 signing keys for seals and attestations."""


@key.command("new")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for lifecycle-signing.key (0600) and .pub (created if missing).",
)
@json_option
def key_new(out: Path) -> None:
    """Make a key pair; print its key id (sha256 of the raw public key), both files and what to export.

    Never overwrites a key.
    """
    from lifecycle_fsm.keys import new_key_pair

    files = new_key_pair(out)
    if wants_json():
        emit({"key_id": files.key_id, "private_key": str(files.private_key), "public_key": str(files.public_key)})
        return
    private = os.path.abspath(files.private_key)
    lines = [
        f"key id: {files.key_id}",
        f"private key: {private} (mode 0600: keep it secret; it signs seals and attestations)",
        f"public key: {os.path.abspath(files.public_key)} (give it to whoever verifies: --pubkey)",
        "to sign with it, export the variable:",
        f"  export LIFECYCLE_SIGNING_KEY={shlex.quote(private)}",
    ]
    for line in lines:
        click.echo(display(line))


@click.command("seal")
@click.option(
    "--out",
    "out",
    type=OutputFile(),
    help="Write the signed head to FILE (refused if it exists; `-` prints) instead of printing.",
)
@event_id_option
@json_option
def seal_command(out: Path | None, event_id: str | None) -> None:
    """Sign the head and append the seal to the `seals` stream; print (or write) the signed head."""
    from lifecycle_fsm.ledger import utc_now
    from lifecycle_fsm.seals import seal, sealed_under, signed_head_text

    if out is not None and str(out) == "-":  # stdout, as `-` means to every other tool
        out = None
    private = require_signing_key("seal")
    ledger = open_ledger(must_exist=True)
    if out is None:
        doc = seal(ledger.store, private, actor=ledger.actor, clock=utc_now, event_id=event_id)
        if wants_json():
            emit(doc)
        else:
            click.echo(signed_head_text(doc), nl=False)
        return
    done = None if event_id is None else sealed_under(ledger.store, event_id)
    if done is not None:  # a retry
        _answered(done, out, event_id)
        return
    if os.path.lexists(out):
        raise InputError(f"{out} already exists: a signed head is never overwritten")
    target = out
    staged: list[tuple[StagedFile, dict[str, object]]] = []

    def write_first(signed: dict[str, object]) -> None:
        """Inside the seal's transaction: the file is on disk before the seal is; one that cannot be, no seal."""
        for earlier, _ in staged:  # an attempt that lost a race to another writer
            earlier.discard()
        staged[:] = [(stage(target, signed_head_text(signed).encode(), what="nothing was sealed"), signed)]

    try:
        doc = seal(
            ledger.store, private, actor=ledger.actor, clock=utc_now, before_commit=write_first, event_id=event_id
        )
    except BaseException:
        for file, _ in staged:
            file.discard()
        raise
    if not staged or staged[0][1] != doc:  # the same keyed seal, run at the same time, landed first
        for file, _ in staged:
            file.discard()
        _answered(doc, out, event_id)
        return
    try:
        staged[0][0].commit(exclusive=True)
    except LifecycleError as e:
        raise type(e)(f"{e}; the seal is in the ledger: `lifecycle seal --out` again writes a new one") from None
    _sealed(doc, out)


def _answered(doc: dict[str, object], out: Path, event_id: str | None) -> None:
    """A keyed seal already in the ledger: answered by `out` holding its signed head (written when missing:
    its first run may have stopped before it wrote it, or be writing it now)."""
    from lifecycle_fsm.seals import signed_head_text

    text = signed_head_text(doc).encode()
    if not os.path.lexists(out):
        with contextlib.suppress(InputError):  # written meanwhile by the run whose seal landed: compared below
            stage(out, text, what="the seal is in the ledger").commit(exclusive=True)
    if not (os.path.isfile(out) and out.read_bytes() == text):
        raise InputError(
            f"the seal keyed {event_id!r} is in the ledger (head seq {doc['seq']}) and {out} does not hold its "
            f"signed head: `lifecycle seal --event-id {event_id}` prints it"
        )
    _sealed(doc, out)


def _sealed(doc: dict[str, object], out: Path) -> None:
    if wants_json():
        emit(doc)
    else:
        click.echo(f"sealed head seq {doc['seq']} {doc['hash']} (key {doc['key_id']}) -> {out}")
