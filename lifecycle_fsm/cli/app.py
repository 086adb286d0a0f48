"""The `lifecycle` group: global options, the `Error: …` convention, and what every command shares.

The group imports a command's module (named in `COMMANDS`) only when that command runs or is
listed, so any command may import this module and `lifecycle status` does not pay for `serve`.
"""

from __future__ import annotations

import functools
import importlib
import os
import sqlite3
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from lifecycle_fsm.cli.exit_codes import EXIT_CODES, ExitCode, exit_code_for
from lifecycle_fsm.errors import InputError, LifecycleError, StoreError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import check_actor, display
from lifecycle_fsm.logs import configure_logging
from lifecycle_fsm.machine import METHOD_BY_COMMAND
from lifecycle_fsm.store.open import is_postgres_url, open_store
from lifecycle_fsm.store.sqlite_files import translate_sqlite_error

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.store.base import EventStore

    _ParamType = click.ParamType[Any]  # generic in click's stubs
else:
    _ParamType = click.ParamType

__all__ = [
    "AS_OF",
    "COMMANDS",
    "SEQ",
    "SuggestingGroup",
    "TIME",
    "closed_output",
    "install_hint",
    "json_option",
    "main",
    "open_ledger",
    "open_read_store",
    "refuse_empty_file",
    "refuse_memory_db",
    "require_signing_key",
    "root_obj",
    "signing_key",
    "unknown_command",
    "wants_json",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# What the embedding API and drill files call the commands: `lifecycle hand_off` points at `handoff`.
_API_NAMES = {
    **{method: command for command, method in METHOD_BY_COMMAND.items()},
    "activate_baseline": "baseline activate",
    "advance_window": "window",
    "activate_evaluation": "evaluation activate",
    "wait_for": "wait",
}


def unknown_command(name: str, commands: Iterable[str], *, api_names: bool = False) -> str:
    """The refusal of an unknown command, naming the nearest ones there are."""
    import difflib

    known = _API_NAMES.get(name.replace("-", "_")) if api_names else None
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


class _LifecycleGroup(SuggestingGroup):
    """Imports each command of `COMMANDS` when first looked up; every refusal, a library error or click's
    usage error, is one `Error:` line on stderr and a documented exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attribute = COMMANDS[cmd_name].rsplit(".", 1)
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), f"{module}.{attribute} is not a click command"
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LifecycleError as e:
            _fail(e)
        except Exception as e:
            # The stores translate their drivers' errors; one that slips through is still one line
            # (psycopg's are known by their module: it may not be installed).
            if not (isinstance(e, sqlite3.DatabaseError) or type(e).__module__.split(".")[0] == "psycopg"):
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
        except click.ClickException as e:
            ctx = e.ctx if isinstance(e, click.UsageError) else None
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            click.echo(f"Error: {display(e.format_message())}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.Abort as e:
            interrupted = isinstance(e.__cause__, KeyboardInterrupt)  # click turns Ctrl-C into Abort
            click.echo(f"Error: {'interrupted' if interrupted else 'aborted'}", err=True)
            sys.exit(int(ExitCode.INTERRUPTED) if interrupted else 1)
        except OSError as e:
            error = _output_error(e)
            if error is None:
                raise
            _fail(error)
        sys.exit(result if isinstance(result, int) else 0)


def _fail(error: LifecycleError) -> NoReturn:
    click.echo(f"Error: {display(str(error))}", err=True)
    sys.exit(int(exit_code_for(error)))


def _output_error(error: OSError) -> InputError | None:
    """The error to report when click's `echo` or rich's console could not write the output (a full disk,
    a closed or broken stdout), else None: one `Error:` line (exit 3), not a traceback."""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if (code.co_name == "echo" and code.co_filename.endswith(os.path.join("click", "utils.py"))) or (
            code.co_filename.endswith(os.path.join("rich", "console.py"))
        ):
            return closed_output(error.strerror or str(error))
        tb = tb.tb_next
    return None


def closed_output(why: str) -> InputError:
    """A write command prints after its commit, so the message says where its events are."""
    return InputError(
        f"cannot write the output ({why}); a write command appends before it prints: `lifecycle log` shows its events"
    )


def root_obj() -> JSON:
    """The root context's options (db, json, actor, synchronous, log_level, signing_key, artifact_root)."""
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


class _Parsed(_ParamType):
    """A value the `replay.log` function named `parser` reads; what it refuses is a usage error."""

    def __init__(self, name: str, parser: str) -> None:
        self.name = name
        self.parser = parser

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from lifecycle_fsm.replay import log

        if isinstance(value, int):  # a default, or a value already converted
            return value
        try:
            if self.parser == "parse_seq":
                return log.parse_seq(str(value), param.opts[0] if param is not None and param.opts else "SEQ")
            return getattr(log, self.parser)(str(value))
        except InputError as e:
            self.fail(str(e), param, ctx)


AS_OF = _Parsed("SEQ|ISO-TIME", "parse_as_of")  # a seq (digits) or an ISO 8601 time
SEQ = _Parsed("SEQ", "parse_seq")  # ASCII digits, from 0
TIME = _Parsed("ISO-TIME", "parse_time")  # Z or an offset (naive = UTC), as the stored UTC text


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


def refuse_memory_db(db: str, what: str = "--db") -> None:
    """`--db :memory:` (or an empty name: a temporary file) would acknowledge writes that vanish."""
    if db in ("", ":memory:") or db.startswith("file::memory:"):
        raise InputError(f"{what} {db!r} is an in-memory database: every write would vanish when the command ends")


def refuse_empty_file(db: str, *, allow_empty: bool = False) -> None:
    """An existing empty file is no ledger (only `init`, `allow_empty`, makes one there); nor is a folder,
    a FIFO (which reads as empty) or a device."""
    if is_postgres_url(db):
        return
    try:
        found = os.stat(db)
    except OSError:  # missing (created by a write command) or unreadable (the store says why)
        return
    if stat.S_ISDIR(found.st_mode):
        raise StoreError(
            f"{db}: a folder, not a ledger file; name the ledger file itself (e.g. {os.path.join(db, 'lifecycle.db')})"
        )
    if not stat.S_ISREG(found.st_mode):
        raise StoreError(f"{db}: not a regular file (a FIFO, device or socket); a ledger is a regular file")
    if found.st_size == 0 and not allow_empty:
        raise StoreError(f"{db}: an empty file, not a ledger (was it truncated?); `lifecycle init` creates one here")


def open_ledger(*, must_exist: bool = False, initialising: bool = False) -> Ledger:
    """The ledger `--db` names, closed with the command. `must_exist`: a missing ledger is refused (exit 3),
    not created; an empty file is refused (exit 7) but by `init` (`initialising`)."""
    from lifecycle_fsm.ledger import Ledger

    obj = root_obj()
    if obj["actor"]:  # empty: the default
        check_actor(obj["actor"])  # before the store: a refused actor creates no ledger
    store = _open_store(obj["db"], create=not must_exist, initialising=initialising)
    ledger = Ledger(store, actor=obj["actor"], artifact_root=obj["artifact_root"])
    click.get_current_context().call_on_close(ledger.close)
    return ledger


def open_read_store(db: str | None = None) -> EventStore:
    """The store of the ledger `--db` (or `db`) names, for a command that only reads; closed with the command."""
    store = _open_store(root_obj()["db"] if db is None else db, create=False)
    click.get_current_context().call_on_close(store.close)
    return store


def _open_store(db: str, *, create: bool, initialising: bool = False) -> EventStore:
    refuse_memory_db(db)
    refuse_empty_file(db, allow_empty=initialising)
    return open_store(db, synchronous=root_obj()["synchronous"], create=create)


# Every command of `lifecycle`, by the module of this package that defines it (`hash_command`: `hash`).
_MODULES = {
    "writes": "init baseline window evaluation receive check trusted untrust fail recovered handoff",
    "queries": "status wait history explain replay diagram",
    "integrity": "checkpoint verify hash_command key seal_command attest",
    "audit": "audit",
    "drill": "drill",
    "auditor": "log report decisions",
    "serve": "serve",
    "migrate": "migrate",
}
COMMANDS = {
    attribute.removesuffix("_command"): f"lifecycle_fsm.cli.{module}.{attribute}"
    for module, attributes in _MODULES.items()
    for attribute in attributes.split()
}


@click.group(cls=_LifecycleGroup, epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
@click.option(
    "--db",
    default="lifecycle.db",
    envvar="LIFECYCLE_DB",
    show_default=True,
    help="Ledger file, or a postgresql:// URL (env LIFECYCLE_DB).",
)
@click.option("--json", is_flag=True, help="Print one JSON document on stdout.")
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
def main(ctx: click.Context, /, synchronous: str, log_level: str, **options: str | bool | None) -> None:
    """An event-sourced ledger for post-training candidates (DPO, GRPO/RLVR).

    Every command appends events to an append-only, hash-chained log (an SQLite file or
    a PostgreSQL schema); state is a fold of those events.
    """
    configure_logging(log_level)
    ctx.obj = {**options, "synchronous": synchronous.upper(), "log_level": log_level}
