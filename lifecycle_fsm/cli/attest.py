"""`attest ID --out FILE` and `attest verify FILE --pubkey PUB [--db DB]`.

`attest ID` is the group's default: any first argument that is not a subcommand is a
candidate id (`attest create ID` says the same explicitly).
"""

from __future__ import annotations

from pathlib import Path

import click

from lifecycle_fsm.cli.app import OutputFile, json_option, open_ledger, require_signing_key, wants_json
from lifecycle_fsm.cli.guards import refuse_empty_file, refuse_memory_db
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.outputs import write_atomic

__all__ = ["AttestGroup", "attest", "attest_create", "attest_verify"]


class AttestGroup(click.Group):
    """`attest ID …` runs `attest create ID …`; `attest verify …` and `--help` are as usual."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


@click.group(cls=AttestGroup)
def attest() -> None:
    """Signed hand-off attestations (DSSE + in-toto Statement v1): `attest ID --out FILE`, `attest verify FILE`."""


@attest.command("create")
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--out",
    "out",
    required=True,
    type=OutputFile(),
    help="Where to write the envelope (refused if it exists); `-`: print it.",
)
@json_option
def attest_create(candidate_id: str, out: Path) -> None:
    """Write ID's hand-off decision as a signed DSSE envelope. Needs a signing key; appends nothing."""
    from lifecycle_fsm.attestation import attest as build_attestation

    key = require_signing_key("attest")
    if str(out) == "-":  # stdout, as `-` means to every other tool
        if wants_json():
            raise click.UsageError("--out - prints the envelope itself (JSON): --json has nothing to add")
        click.echo(_envelope_text(build_attestation(open_ledger(must_exist=True).store, candidate_id, key)), nl=False)
        return
    if out.exists():
        raise InputError(f"{out} already exists: an attestation is never overwritten")
    envelope = build_attestation(open_ledger(must_exist=True).store, candidate_id, key)
    write_atomic(out, _envelope_text(envelope).encode(), exclusive=True)
    if wants_json():
        emit({"path": str(out), "candidate": candidate_id, "key_id": envelope["signatures"][0]["keyid"]})
    else:
        click.echo(f"attested {candidate_id} -> {out}")


def _envelope_text(envelope: JSON) -> str:
    import orjson

    return orjson.dumps(envelope, option=orjson.OPT_INDENT_2).decode() + "\n"


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
