"""Keys, seals and attestations: `key new`, `seal`, `attest ID`, `attest verify`.

`verify --expect-head/--pubkey` lives with `verify` (`integrity.py`). A command that needs a key and
has none exits 3 with nothing appended.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path
from typing import Any

import click
import orjson

from lifecycle_fsm.cli.app import (
    SuggestingGroup,
    json_option,
    open_ledger,
    refuse_empty_file,
    refuse_memory_db,
    require_signing_key,
    wants_json,
)
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.cli.writes import event_id_option
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.outputs import StagedFile, stage, write_atomic

__all__ = ["attest", "attest_create", "attest_verify", "key", "key_new", "seal_command"]


class _OutputFile(click.Path):
    """A file to write (`-` included); a name ending in a separator, `.` or `..` names a folder and is refused
    (a Path would drop the `/` and write a file named like the folder)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value != "-" and os.path.basename(value) in ("", ".", ".."):
            self.fail(f"{value!r} names a folder: give the file's name", param, ctx)
        return super().convert(value, param, ctx)


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
    for line in (
        f"key id: {files.key_id}",
        f"private key: {private} (mode 0600: keep it secret; it signs seals and attestations)",
        f"public key: {os.path.abspath(files.public_key)} (give it to whoever verifies: --pubkey)",
        "to sign with it, export the variable:",
        f"  export LIFECYCLE_SIGNING_KEY={shlex.quote(private)}",
    ):
        click.echo(display(line))


@click.command("seal")
@click.option(
    "--out",
    "out",
    type=_OutputFile(),
    help="Write the signed head to FILE (refused if it exists; `-` prints) instead of printing.",
)
@event_id_option
@json_option
def seal_command(out: Path | None, event_id: str | None) -> None:
    """Sign the head and append the seal to the `seals` stream; print (or write) the signed head."""
    from lifecycle_fsm.ledger import utc_now
    from lifecycle_fsm.seals import seal, sealed_under, signed_head_text

    private = require_signing_key("seal")
    ledger = open_ledger(must_exist=True)
    if out is None or str(out) == "-":  # stdout, as `-` means to every other tool
        doc = seal(ledger.store, private, actor=ledger.actor, clock=utc_now, event_id=event_id)
        emit(doc) if wants_json() else click.echo(signed_head_text(doc), nl=False)
        return
    done = None if event_id is None else sealed_under(ledger.store, event_id)
    if done is not None:  # a retry
        _answered(done, out, event_id)
        return
    if os.path.lexists(out):
        raise InputError(f"{out} already exists: a signed head is never overwritten")
    target = out
    staged: list[tuple[StagedFile, JSON]] = []

    def write_first(signed: JSON) -> None:
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


def _answered(doc: JSON, out: Path, event_id: str | None) -> None:
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


def _sealed(doc: JSON, out: Path) -> None:
    if wants_json():
        emit(doc)
    else:
        click.echo(f"sealed head seq {doc['seq']} {doc['hash']} (key {doc['key_id']}) -> {out}")


class _AttestGroup(click.Group):
    """`attest ID …` runs `attest create ID …`; `attest verify …` and `--help` are as usual."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_AttestGroup)
def attest() -> None:
    """Signed hand-off attestations (DSSE + in-toto Statement v1): `attest ID --out FILE`, `attest verify FILE`."""


@attest.command("create")
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--out",
    "out",
    required=True,
    type=_OutputFile(),
    help="Where to write the envelope (refused if it exists); `-`: print it.",
)
@json_option
def attest_create(candidate_id: str, out: Path) -> None:
    """Write ID's hand-off decision as a signed DSSE envelope. Needs a signing key; appends nothing."""
    from lifecycle_fsm.attestation import attest as build_attestation

    key = require_signing_key("attest")
    printed = str(out) == "-"  # stdout, as `-` means to every other tool
    if printed and wants_json():
        raise click.UsageError("--out - prints the envelope itself (JSON): --json has nothing to add")
    if not printed and out.exists():
        raise InputError(f"{out} already exists: an attestation is never overwritten")
    envelope = build_attestation(open_ledger(must_exist=True).store, candidate_id, key)
    text = orjson.dumps(envelope, option=orjson.OPT_INDENT_2).decode() + "\n"
    if printed:
        click.echo(text, nl=False)
        return
    write_atomic(out, text.encode(), exclusive=True)
    if wants_json():
        emit({"path": str(out), "candidate": candidate_id, "key_id": envelope["signatures"][0]["keyid"]})
    else:
        click.echo(f"attested {candidate_id} -> {out}")


@attest.command("verify")
@click.argument("file", type=click.Path(path_type=Path), metavar="FILE")
@click.option(
    "--pubkey",
    "pubkeys",
    multiple=True,
    required=True,
    type=click.Path(),
    metavar="FILE",
    help="A trusted public key (repeatable).",
)
@click.option("--db", "db", help="Also check that the attested events are in this ledger's chain (file or URL).")
@json_option
def attest_verify(file: Path, pubkeys: tuple[str, ...], db: str | None) -> None:
    """Check an attestation's signature offline; with --db, against that ledger. Exit 6 if it does not hold."""
    from lifecycle_fsm.attestation import verify_attestation
    from lifecycle_fsm.keys import load_public_key
    from lifecycle_fsm.limits import MAX_ATTESTATION_BYTES, read_regular_file
    from lifecycle_fsm.store.open import open_store

    text = read_regular_file(file, what="attestation", limit=MAX_ATTESTATION_BYTES)  # never a FIFO or a device
    keys = [load_public_key(p) for p in pubkeys]
    store = None
    if db is not None:
        refuse_memory_db(db)
        refuse_empty_file(db)
        store = open_store(db, create=False)
        click.get_current_context().call_on_close(store.close)
    report = verify_attestation(text, keys, source=str(file), store=store)
    if wants_json():
        emit(report)
    else:
        where = "offline and against the ledger" if store is not None else "offline (no --db)"
        signers = ", ".join(report["key_ids"])
        click.echo(display(f"ok: {report['candidate']} {report['decision']}, signed by {signers}, checked {where}"))
