"""Commands that prove things: `verify` the log (a finding exits 6 after its report), `checkpoint` it, `hash`
an artifact; signing keys, seals of the head and hand-off attestations (a command that needs a key and has
none exits 3 with nothing appended).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from lifecycle_fsm.cli.app import (
    SuggestingGroup,
    json_option,
    open_ledger,
    open_read_store,
    require_signing_key,
    root_obj,
    signing_key,
    wants_json,
)
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.cli.writes import event_id_option
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.outputs import StagedFile, stage, write_atomic

__all__ = [
    "attest",
    "attest_create",
    "attest_verify",
    "checkpoint",
    "hash_command",
    "key",
    "key_new",
    "seal_command",
    "verify",
]


_F = TypeVar("_F", bound=Callable[..., Any])


def _pubkey_option(text: str, *, required: bool = False) -> Callable[[_F], _F]:
    return click.option(
        "--pubkey", "pubkeys", multiple=True, required=required, type=click.Path(), metavar="FILE", help=text
    )


@click.command()
@json_option
def checkpoint() -> None:
    """Snapshot every folded state at the head, for fast loading; with a signing key, seal the head too."""
    from lifecycle_fsm.manifests import utc_now
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
@_pubkey_option("A trusted public key (repeatable): every seal must be signed by one of them.")
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
    from lifecycle_fsm.replay import verify as verify_ledger
    from lifecycle_fsm.seals import add_trust_findings, parse_expected_head

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
    from lifecycle_fsm.artifact_walk import folder_problem

    if root is not None and (problem := folder_problem(root)):
        raise InputError(f"--root {root} {problem}")  # bad input (exit 3), not "path escapes root"
    from lifecycle_fsm.artifacts import hash_tree, tree_size

    watched = not wants_json() and sys.stderr.isatty() and os.path.isdir(path)
    total = tree_size(path, root) if watched else 0
    if total < 64 * 1024 * 1024:  # a progress bar only for a large tree, and only when a person is watching
        digest = hash_tree(path, root, max_listed=0)
    else:
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task(f"hashing {path}", total=total)
            digest = hash_tree(path, root, progress=lambda n: progress.advance(task, n), max_listed=0)
    if wants_json():  # a directory's digest is no `sha256sum` output: the algorithm names its format
        emit({"path": str(path), "sha256": digest.sha256, "algorithm": digest.algorithm})
    else:
        click.echo(f"{digest.sha256}  {path}")


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
    type=_OutputFile(),
    help="Write the signed head to FILE (refused if it exists; `-` prints) instead of printing.",
)
@event_id_option
@json_option
def seal_command(out: Path | None, event_id: str | None) -> None:
    """Sign the head and append the seal to the `seals` stream; print (or write) the signed head."""
    from lifecycle_fsm.manifests import utc_now
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
    staged: list[tuple[StagedFile, JSON]] = []

    def write_first(signed: JSON) -> None:
        """Inside the seal's transaction: the file is on disk before the seal is; one that cannot be, no seal."""
        for earlier, _ in staged:  # an attempt that lost a race to another writer
            earlier.discard()
        staged[:] = [(stage(out, signed_head_text(signed).encode(), what="nothing was sealed"), signed)]

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
@_pubkey_option("A trusted public key (repeatable).", required=True)
@click.option("--db", help="Also check that the attested events are in this ledger's chain (file or URL).")
@json_option
def attest_verify(file: Path, pubkeys: tuple[str, ...], db: str | None) -> None:
    """Check an attestation's signature offline; with --db, against that ledger. Exit 6 if it does not hold."""
    from lifecycle_fsm.attestation import verify_attestation
    from lifecycle_fsm.keys import load_public_key
    from lifecycle_fsm.limits import MAX_ATTESTATION_BYTES, read_regular_file

    text = read_regular_file(file, what="attestation", limit=MAX_ATTESTATION_BYTES)  # never a FIFO or a device
    keys = [load_public_key(p) for p in pubkeys]
    store = None if db is None else open_read_store(db)
    report = verify_attestation(text, keys, source=str(file), store=store)
    if wants_json():
        emit(report)
    else:
        where = "offline and against the ledger" if store is not None else "offline (no --db)"
        signers = ", ".join(report["key_ids"])
        click.echo(display(f"ok: {report['candidate']} {report['decision']}, signed by {signers}, checked {where}"))
