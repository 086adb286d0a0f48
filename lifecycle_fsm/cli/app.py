"""The `lifecycle` group: global options, the `Error: …` convention, and helpers every command shares.

Commands live in their own modules and are named in `COMMANDS`; the group imports a command's
module when that command is run or listed (click's lazy group), so this module imports none of
them, any of them can import it, and `lifecycle status` does not pay for `attest` or `serve`.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from lifecycle_fsm.cli.exit_codes import EXIT_CODES, ExitCode, exit_code_for
from lifecycle_fsm.cli.guards import closed_output, is_driver_error, output_error, refuse_empty_file, refuse_memory_db
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import check_actor, display
from lifecycle_fsm.logs import configure_logging
from lifecycle_fsm.store.open import open_store
from lifecycle_fsm.store.sqlite_errors import translate_sqlite_error

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.store.base import EventStore

    _ParamType = click.ParamType[Any]  # generic in click's stubs
else:
    _ParamType = click.ParamType

__all__ = [
    "API_NAMES",
    "AS_OF",
    "COMMANDS",
    "LifecycleGroup",
    "OutputFile",
    "ParsedType",
    "SEQ",
    "SuggestingGroup",
    "TIME",
    "install_hint",
    "json_option",
    "main",
    "open_ledger",
    "open_read_store",
    "require_signing_key",
    "root_obj",
    "signing_key",
    "unknown_command",
    "wants_json",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# What the embedding API and drill files call the commands: `lifecycle hand_off` points at `handoff`.
API_NAMES = {
    "hand_off": "handoff",
    "fail_stage": "fail",
    "complete_recovery": "recovered",
    "record_trusted_state": "trusted",
    "invalidate_trusted_state": "untrust",
    "activate_baseline": "baseline activate",
    "advance_window": "window",
    "activate_evaluation": "evaluation activate",
    "wait_for": "wait",
}


def unknown_command(name: str, commands: Iterable[str], *, api_names: bool = False) -> str:
    """The refusal of an unknown command, naming the nearest ones there are."""
    import difflib

    known = API_NAMES.get(name.replace("-", "_")) if api_names else None
    guesses = [known] if known else difflib.get_close_matches(name, list(commands), n=3, cutoff=0.6)
    if not guesses:
        return f"No such command {name!r}."
    return f"No such command {name!r}. Did you mean {' or '.join(repr(g) for g in guesses)}?"


class SuggestingGroup(click.Group):
    """A group that answers an unknown command with the commands it may have meant."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            ctx.fail(unknown_command(name, self.list_commands(ctx), api_names=ctx.parent is None))
        return super().resolve_command(ctx, args)


class LifecycleGroup(SuggestingGroup):
    """The `lifecycle` group: its commands are named by `module.attribute` and imported when first
    looked up, and every refusal is one `Error:` line on stderr and a documented exit code.

    Library errors are mapped by `exit_codes.exit_code_for`; click's usage errors (a
    missing argument, a bad number) are code 2 with the same one-line form and a
    pointer to `--help`.
    """

    def __init__(self, *args: Any, lazy_subcommands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            module, attribute = self.lazy_subcommands[cmd_name].rsplit(".", 1)
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command), f"{module}.{attribute} is not a click command"
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LifecycleError as e:
            _fail(e)
        except Exception as e:
            # The stores translate their drivers' errors; one that slips through is still one line.
            if not is_driver_error(e):
                raise
            _fail(translate_sqlite_error(e, root_obj().get("db", "the ledger")))

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if sys.stdout is None:  # started with stdout closed (`lifecycle … >&-`): run nothing that cannot report
            _fail(closed_output("standard output is closed"))
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            # The help text as one `Error:` line is unreadable: name the commands and where the help is.
            group = e.ctx.command
            names = ", ".join(group.list_commands(e.ctx)) if isinstance(group, click.Group) else ""
            click.echo(f"Error: missing command: one of {names} (see `{e.ctx.command_path} --help`)", err=True)
            sys.exit(e.exit_code)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            click.echo(f"Error: {display(e.format_message())}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"Error: {display(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except click.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
                click.echo("Error: interrupted", err=True)
                sys.exit(int(ExitCode.INTERRUPTED))
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        except OSError as e:
            error = output_error(e)
            if error is None:
                raise
            _fail(error)
        sys.exit(result if isinstance(result, int) else 0)


def _fail(error: LifecycleError) -> NoReturn:
    click.echo(f"Error: {display(str(error))}", err=True)
    sys.exit(int(exit_code_for(error)))


def root_obj() -> JSON:
    """The root context's options (db, json, actor, synchronous, log_level), as `main` stored them."""
    return click.get_current_context().find_root().ensure_object(dict)


def wants_json() -> bool:
    """Whether `--json` was given, before or after the subcommand."""
    return bool(root_obj().get("json"))


def json_option(func: _F) -> _F:
    """`--json` also works after the subcommand."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, **kwargs: Any) -> Any:
        if as_json:
            root_obj()["json"] = True
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class ParsedType(_ParamType):
    """A value `replay.asof` parses (a seq, a time, or either); what it refuses is a usage error."""

    def __init__(self, name: str, parser: str) -> None:
        self.name = name
        self.parser = parser  # the name of the `replay.asof` function that reads it

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from lifecycle_fsm.replay import asof

        if isinstance(value, int):  # a default, or a value already converted
            return value
        try:
            if self.parser == "parse_seq":
                return asof.parse_seq(str(value), param.opts[0] if param is not None and param.opts else "SEQ")
            return getattr(asof, self.parser)(str(value))
        except InputError as e:
            self.fail(str(e), param, ctx)


class OutputFile(click.Path):
    """A file to write (`-` included): a name ending in a separator, `.` or `..` means a folder, and is
    refused rather than written as a file named like the folder (a Path drops the `/` and the `/.`)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value != "-" and os.path.basename(value) in ("", ".", ".."):
            self.fail(f"{value!r} names a folder: give the file's name", param, ctx)
        return super().convert(value, param, ctx)


AS_OF = ParsedType("SEQ|ISO-TIME", "parse_as_of")  # a seq (digits) or an ISO 8601 time
SEQ = ParsedType("SEQ", "parse_seq")  # ASCII digits, from 0
TIME = ParsedType("ISO-TIME", "parse_time")  # Z or an offset (naive = UTC), as the stored UTC text


def install_hint(extra: str) -> str:
    """How to install an extra: from this checkout when running from one, else from the package index."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "pyproject.toml").is_file() or not (checkout / "lifecycle_fsm").is_dir():
        return f"pip install 'lifecycle-fsm[{extra}]'"
    here = Path.cwd().resolve() == checkout
    return f"pip install -e '{'.' if here else checkout}[{extra}]'" + ("" if here else " (this checkout)")


def signing_key() -> Ed25519PrivateKey | None:
    """The key `--signing-key` / LIFECYCLE_SIGNING_KEY names, loaded (None when none was given)."""
    path = root_obj().get("signing_key")
    if not path:
        return None
    from lifecycle_fsm.keys import load_private_key

    return load_private_key(path)


def require_signing_key(what: str) -> Ed25519PrivateKey:
    """The signing key, or exit 3 before anything is appended."""
    key = signing_key()
    if key is None:
        raise InputError(f"{what} needs a signing key: --signing-key PATH or LIFECYCLE_SIGNING_KEY")
    return key


def open_ledger(*, must_exist: bool = False, initialising: bool = False) -> Ledger:
    """The ledger `--db` names, closed when the command's context closes.

    `must_exist` refuses (exit 3) a missing file, or a PostgreSQL schema without a
    ledger, instead of creating it. An existing 0-byte file is refused (exit 7) by every
    command but `init` (`initialising`): a truncated ledger must not silently start over.
    """
    from lifecycle_fsm.ledger import Ledger

    obj = root_obj()
    if obj["actor"]:  # empty: the default
        check_actor(obj["actor"])  # before the store: a refused actor creates no ledger
    store = _open_store(obj, create=not must_exist, initialising=initialising)
    ledger = Ledger(store, actor=obj["actor"], artifact_root=obj["artifact_root"])
    click.get_current_context().call_on_close(ledger.close)
    return ledger


def open_read_store() -> EventStore:
    """The store of the ledger `--db` names, for a command that only reads; closed with the command."""
    store = _open_store(root_obj(), create=False)
    click.get_current_context().call_on_close(store.close)
    return store


def _open_store(obj: JSON, *, create: bool, initialising: bool = False) -> EventStore:
    refuse_memory_db(obj["db"])
    refuse_empty_file(obj["db"], allow_empty=initialising)
    return open_store(obj["db"], synchronous=obj["synchronous"], create=create)


# Every command of `lifecycle`: its name and where it is defined.
COMMANDS = {
    "init": "lifecycle_fsm.cli.writes.init",
    "baseline": "lifecycle_fsm.cli.writes.baseline",
    "window": "lifecycle_fsm.cli.writes.window",
    "evaluation": "lifecycle_fsm.cli.writes.evaluation",
    "receive": "lifecycle_fsm.cli.writes.receive",
    "check": "lifecycle_fsm.cli.writes.check",
    "trusted": "lifecycle_fsm.cli.writes.trusted",
    "untrust": "lifecycle_fsm.cli.writes.untrust",
    "fail": "lifecycle_fsm.cli.writes.fail",
    "recovered": "lifecycle_fsm.cli.writes.recovered",
    "handoff": "lifecycle_fsm.cli.writes.handoff",
    "status": "lifecycle_fsm.cli.queries.status",
    "wait": "lifecycle_fsm.cli.queries.wait",
    "history": "lifecycle_fsm.cli.queries.history",
    "explain": "lifecycle_fsm.cli.queries.explain",
    "replay": "lifecycle_fsm.cli.queries.replay",
    "diagram": "lifecycle_fsm.cli.queries.diagram",
    "checkpoint": "lifecycle_fsm.cli.integrity.checkpoint",
    "verify": "lifecycle_fsm.cli.integrity.verify",
    "hash": "lifecycle_fsm.cli.integrity.hash_command",
    "audit": "lifecycle_fsm.cli.audit.audit",
    "drill": "lifecycle_fsm.cli.drill.drill",
    "decisions": "lifecycle_fsm.cli.decisions.decisions",
    "log": "lifecycle_fsm.cli.auditor.log",
    "report": "lifecycle_fsm.cli.auditor.report",
    "serve": "lifecycle_fsm.cli.serve.serve",
    "migrate": "lifecycle_fsm.cli.migrate.migrate",
    "key": "lifecycle_fsm.cli.trust.key",
    "seal": "lifecycle_fsm.cli.trust.seal_command",
    "attest": "lifecycle_fsm.cli.attest.attest",
}


@click.group(
    cls=LifecycleGroup,
    lazy_subcommands=COMMANDS,
    epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()),
)
@click.option(
    "--db",
    default="lifecycle.db",
    envvar="LIFECYCLE_DB",
    show_default=True,
    help="Ledger file, or a postgresql:// URL (env LIFECYCLE_DB).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--actor", envvar="LIFECYCLE_ACTOR", help="Who records the events (default user@host:pid).")
@click.option(
    "--synchronous",
    envvar="LIFECYCLE_SYNCHRONOUS",
    default="FULL",
    show_default=True,
    type=click.Choice(["NORMAL", "FULL", "EXTRA"], case_sensitive=False),
    help="Durability: FULL survives power loss, NORMAL a process crash (PostgreSQL: synchronous_commit on/off).",
)
@click.option(
    "--log-level",
    envvar="LIFECYCLE_LOG_LEVEL",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Structured logs on stderr.",
)
@click.option(
    "--signing-key",
    envvar="LIFECYCLE_SIGNING_KEY",
    type=click.Path(),
    metavar="FILE",
    help="Ed25519 private key (PKCS#8 PEM) that seals and attestations are signed with.",
)
@click.option(
    "--artifact-root",
    envvar="LIFECYCLE_ARTIFACT_ROOT",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Read manifests' relative artifact paths inside DIR (default: each manifest's own folder).",
)
@click.version_option(package_name="lifecycle-fsm")
@click.pass_context
def main(
    ctx: click.Context,
    db: str,
    as_json: bool,
    actor: str | None,
    synchronous: str,
    log_level: str,
    signing_key: str | None,
    artifact_root: str | None,
) -> None:
    """An event-sourced ledger for post-training candidates (DPO, GRPO/RLVR).

    Every command appends events to an append-only, hash-chained log (an SQLite file or
    a PostgreSQL schema); state is a fold of those events.
    """
    configure_logging(log_level)
    ctx.obj = {
        "db": db,
        "json": as_json,
        "actor": actor,
        "synchronous": synchronous.upper(),
        "log_level": log_level,
        "signing_key": signing_key,
        "artifact_root": artifact_root,
    }
