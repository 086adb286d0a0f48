"""The `lifecycle` command line: a thin edge over the Ledger, the store and replay.

The composition root: the only module that imports all three packages and the only
one that configures logging. Commands parse arguments, call the library and print;
they hold no logic. With `--json`, stdout is exactly one JSON document. Errors are
one `Error: …` line on stderr and a documented exit code (see `EXIT_CODES`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from lifecycle_fsm.artifacts import hash_directory, tree_size
from lifecycle_fsm.cli_audit import audit
from lifecycle_fsm.cli_drill import drill
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.ledger import Ledger, utc_now
from lifecycle_fsm.logs import configure_logging
from lifecycle_fsm.machine import diagram as mermaid_diagram
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.render import (
    candidate_json,
    emit,
    print_explain,
    print_history,
    print_result,
    print_status,
)
from lifecycle_fsm.rules import STAGES
from replay import LoadResult, index_of, load_state, take_checkpoint
from replay import explain as explain_candidate
from replay import verify as verify_ledger
from store.records import StreamHead

__all__ = ["EXIT_CODES", "main"]

EXIT_CODES = {
    0: "success (for `verify`: the chain and every checkpoint hold)",
    1: "unexpected internal error (a bug: please report it with the traceback)",
    2: "usage error: unknown command or option, missing argument",
    3: "bad input: missing file, bad JSON, malformed manifest, unknown stage or kind",
    4: "not found: unknown candidate id",
    5: "conflict: the candidate's state does not allow the command, or another writer won",
    6: "integrity: the hash chain, a checkpoint or a recorded transition is broken",
    7: "store: the database file is unusable or stayed locked",
    8: "drill: an expectation did not hold",
}

F = TypeVar("F", bound=Callable[..., Any])


class LifecycleGroup(click.Group):
    """Every refusal is one `Error:` line on stderr and a documented exit code.

    Library errors carry their own code; click's usage errors (a missing argument, a
    bad number) are code 2 with the same one-line form and a pointer to `--help`.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LifecycleError as e:
            click.echo(f"Error: {e}", err=True)
            sys.exit(e.exit_code)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            click.echo(f"Error: {e.format_message()}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


def json_option(func: F) -> F:
    """`--json` also works after the subcommand."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if as_json:
            ctx.find_root().obj["json"] = True
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _obj() -> dict[str, Any]:
    return click.get_current_context().find_root().obj  # type: ignore[no-any-return]


def _ledger(*, must_exist: bool = False) -> Ledger:
    obj = _obj()
    path = Path(obj["db"])
    if must_exist and not path.exists():
        raise InputError(f"no ledger at {path} (create one with `lifecycle init`)")
    ledger = Ledger.open(path, synchronous=obj["synchronous"], actor=obj["actor"])
    click.get_current_context().call_on_close(ledger.close)
    return ledger


def _json() -> bool:
    return bool(_obj()["json"])


@click.group(cls=LifecycleGroup, epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()))
@click.option(
    "--db", default="lifecycle.db", envvar="LIFECYCLE_DB", show_default=True, help="Ledger file (env LIFECYCLE_DB)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--actor", envvar="LIFECYCLE_ACTOR", help="Who records the events (default user@host:pid).")
@click.option(
    "--synchronous",
    envvar="LIFECYCLE_SYNCHRONOUS",
    default="FULL",
    show_default=True,
    type=click.Choice(["NORMAL", "FULL", "EXTRA"], case_sensitive=False),
    help="SQLite durability: FULL survives power loss, NORMAL survives a process crash.",
)
@click.option("--log-level", envvar="LIFECYCLE_LOG_LEVEL", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Structured logs on stderr.")  # fmt: skip
@click.version_option(package_name="lifecycle-fsm")
@click.pass_context
def main(ctx: click.Context, db: str, as_json: bool, actor: str | None, synchronous: str, log_level: str) -> None:
    """An event-sourced ledger for post-training candidates (DPO, GRPO/RLVR).

    Every command appends events to an append-only, hash-chained SQLite log; state
    is a fold of those events.
    """
    configure_logging(log_level)
    ctx.obj = {"db": db, "json": as_json, "actor": actor, "synchronous": synchronous.upper(), "log_level": log_level}


@main.command()
@click.option("--max-window-age", default=2, show_default=True, type=click.IntRange(min=0))
@click.option("--active-window", default=1, show_default=True, type=click.IntRange(min=0))
@json_option
def init(max_window_age: int, active_window: int) -> None:
    """Create the ledger and fix its freshness settings."""
    print_result(_ledger().init(max_window_age, active_window), _json(), "initialized")


@main.group()
def baseline() -> None:
    """The active SFT baseline."""


@baseline.command("activate")
@click.argument("sft_manifest", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def baseline_activate(sft_manifest: Path) -> None:
    """Make SFT_MANIFEST's adapter the active policy; decided candidates must be re-checked."""
    load_baseline_manifest(sft_manifest)  # bad input fails before a ledger file is created
    print_result(_ledger().activate_baseline(sft_manifest), _json(), "baseline activated")


@main.command()
@click.argument("n", type=int)
@json_option
def window(n: int) -> None:
    """Advance the active rollout window to N (online candidates must be re-checked)."""
    print_result(_ledger().advance_window(n), _json(), "window advanced")


@main.group()
def evaluation() -> None:
    """The evaluation version candidates must name."""


@evaluation.command("activate")
@click.argument("version")
@json_option
def evaluation_activate(version: str) -> None:
    """Require VERSION as every candidate's evaluation_version from now on."""
    print_result(_ledger().activate_evaluation(version), _json(), "evaluation activated")


@main.command()
@click.argument("candidate_manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--id", "candidate_id", help="Candidate id (default: the manifest's policy_version).")
@click.option("--event-id", help="Idempotency key: a retry with the same key is a no-op.")
@json_option
def receive(candidate_manifest: Path, candidate_id: str | None, event_id: str | None) -> None:
    """Receive a candidate manifest (identical re-receipt is a no-op)."""
    load_candidate_manifest(candidate_manifest)  # bad input fails before a ledger file is created
    print_result(
        _ledger().receive(candidate_manifest, candidate_id=candidate_id, event_id=event_id), _json(), "received"
    )


@main.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def check(candidate_id: str) -> None:
    """Run every check now: lineage, freshness, artifact and rollback re-hash."""
    print_result(_ledger(must_exist=True).check(candidate_id), _json(), "checked")


@main.command()
@click.argument("candidate_id", metavar="ID")
@click.argument("kind", metavar="KIND")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--event-id", help="Idempotency key: a retry with the same key is a no-op.")
@json_option
def trusted(candidate_id: str, kind: str, path: Path, event_id: str | None) -> None:
    """Record a trusted state (KIND at PATH, hashed now) that recovery may resume from.

    KIND is one of prompt_queue, trajectories, pre_update_checkpoint, verified_baseline.
    """
    result = _ledger(must_exist=True).record_trusted_state(candidate_id, kind, path, event_id=event_id)
    print_result(result, _json(), f"trusted {kind} recorded")


@main.command()
@click.argument("candidate_id", metavar="ID")
@click.argument("kind", metavar="KIND")
@click.option("--reason", default="invalidated by operator", show_default=True)
@json_option
def untrust(candidate_id: str, kind: str, reason: str) -> None:
    """Invalidate a recorded trusted state (it stays in history)."""
    print_result(
        _ledger(must_exist=True).invalidate_trusted_state(candidate_id, kind, reason), _json(), f"{kind} invalidated"
    )


@main.command()
@click.argument("candidate_id", metavar="ID")
@click.option("--stage", required=True, help=f"The training stage that failed: {', '.join(STAGES)}.")
@click.option("--event-id", help="Idempotency key: a retry with the same key is a no-op.")
@json_option
def fail(candidate_id: str, stage: str, event_id: str | None) -> None:
    """Report a failed stage; prints the recovery plan from the latest trusted state."""
    result = _ledger(must_exist=True).fail_stage(candidate_id, stage, event_id=event_id)
    assert result.candidate is not None
    # The plan this command recorded (a retried --event-id returns the original one).
    plan = next(orjson.loads(e.payload) for e in result.events if e.type == "RecoveryPlanned")
    doc = {
        "id": candidate_id,
        "stage": plan["stage"],
        "recovery_state": plan["recovery_state"],
        "reused_state": plan["reused_state"],
        "action": plan["action"],
        "state": result.candidate.state,
        "trusted_states": plan["trusted_states"],
        "events": [e.seq for e in result.events],
    }
    if _json():
        emit(doc)
    else:
        reused = f"reuse {plan['recovery_state']}" if plan["reused_state"] else "no trusted state to reuse"
        click.echo(f"{candidate_id}: {plan['stage']} failed -> {plan['action']} ({reused}); state {doc['state']}")


@main.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def recovered(candidate_id: str) -> None:
    """The planned recovery finished; the candidate must be checked again."""
    print_result(_ledger(must_exist=True).complete_recovery(candidate_id), _json(), "recovered")


@main.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def handoff(candidate_id: str) -> None:
    """Re-run the checks and decide: ready (for evaluation), tune or reject."""
    print_result(_ledger(must_exist=True).hand_off(candidate_id), _json(), "handed off")


@main.command()
@click.argument("candidate_id", metavar="[ID]", required=False)
@json_option
def status(candidate_id: str | None) -> None:
    """Every candidate's state (from the latest checkpoint + tail), or one candidate's."""
    ledger = _ledger(must_exist=True)
    if candidate_id is not None:
        doc = candidate_json(ledger.candidate(candidate_id))
        emit(doc) if _json() else print_status([doc])
        return
    states = load_state(ledger.store).state.candidates
    docs = [candidate_json(c) for _, c in sorted(states.items())]
    emit(docs) if _json() else print_status(docs)


@main.command()
@click.argument("candidate_id", metavar="ID")
@json_option
def history(candidate_id: str) -> None:
    """Every event of one candidate, oldest first."""
    print_history(_ledger(must_exist=True).history(candidate_id), _json())


@main.command()
@click.argument("candidate_id", metavar="ID")
@click.option("--as-of", type=click.IntRange(min=1), help="Explain the state as of this global position.")
@json_option
def explain(candidate_id: str, as_of: int | None) -> None:
    """Why ID is in its state: reason codes and the decisive event's evidence."""
    doc = explain_candidate(_ledger(must_exist=True).store, candidate_id, as_of=as_of)
    emit(doc) if _json() else print_explain(doc)


@main.command()
@click.option("--to", "to", type=click.IntRange(min=0), help="Replay only up to this global position.")
@click.option("--full", is_flag=True, help="Ignore checkpoints and rebuild the state index from the whole log.")
@json_option
def replay(to: int | None, full: bool) -> None:
    """Rebuild every candidate's state from the log (latest checkpoint + tail)."""
    ledger = _ledger(must_exist=True)
    if full and to is None:
        # Fold and rebuild under the write lock, so no append lands in between.
        results: list[LoadResult] = []

        def derive() -> list[StreamHead]:
            results.append(load_state(ledger.store, use_checkpoints=False))
            return index_of(results[0].state)

        ledger.store.rebuild_stream_index(derive)
        loaded = results[0]
    else:
        loaded = load_state(ledger.store, to=to, use_checkpoints=not full)
    docs = [candidate_json(c) for _, c in sorted(loaded.state.candidates.items())]
    doc = {
        "states": docs,
        "checkpoint": None if loaded.checkpoint is None else loaded.checkpoint.position,
        "position": loaded.state.position,
        "skipped_checkpoints": [{"checkpoint_id": cid, "reason": why} for cid, why in loaded.skipped],
    }
    if _json():
        emit(doc)
        return
    start = "the beginning" if loaded.checkpoint is None else f"checkpoint at seq {loaded.checkpoint.position}"
    click.echo(f"replayed from {start} to seq {loaded.state.position}")
    for cid, why in loaded.skipped:
        click.echo(f"skipped checkpoint {cid}: {why}")
    print_status(docs)


@main.command()
@json_option
def checkpoint() -> None:
    """Snapshot every folded state at the head, for fast loading."""
    record = take_checkpoint(_ledger(must_exist=True).store, clock=utc_now)
    doc = {"checkpoint_id": record.checkpoint_id, "position": record.position, "head_hash": record.head_hash}
    emit(doc) if _json() else click.echo(f"checkpoint {record.checkpoint_id} at seq {record.position}")


@main.command()
@json_option
def verify() -> None:
    """Re-hash the chain, check every checkpoint, replay every transition. Exit 6 if broken."""
    report = verify_ledger(_ledger(must_exist=True).store)
    if _json():
        emit(report)
    elif report["ok"]:
        click.echo(f"ok: {report['events']} events, head seq {report['head']['seq']} {report['head']['hash']}")
    else:
        click.echo(f"BROKEN at seq {report.get('bad_seq')}: {report['reason']}")
    if not report["ok"]:
        sys.exit(6)


@main.command("hash")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), help="Symlinks may point anywhere inside ROOT."
)
@json_option
def hash_command(path: Path, root: Path | None) -> None:
    """The sha256 that manifests record for a file or a directory."""
    digest = _hash_with_progress(path, root)
    if _json():
        emit({"path": str(path), "sha256": digest, "algorithm": "sha256"})
    else:
        click.echo(f"{digest}  {path}")


def _hash_with_progress(path: Path, root: Path | None) -> str:
    """Hash, with a progress bar on stderr for large trees when a person is watching."""
    if _json() or not sys.stderr.isatty() or not os.path.isdir(path):
        return hash_directory(path, root)
    total = tree_size(path, root)
    if total < 64 * 1024 * 1024:
        return hash_directory(path, root)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task(f"hashing {path}", total=total)
        return hash_directory(path, root, progress=lambda n: progress.advance(task, n))


@main.command()
@json_option
def diagram() -> None:
    """The state machine as Mermaid text."""
    text = mermaid_diagram()
    emit({"mermaid": text}) if _json() else click.echo(text)


# Commands with their own modules (they only need the root context's options).
main.add_command(audit)
main.add_command(drill)


if __name__ == "__main__":  # pragma: no cover
    main()
