"""`lifecycle audit`: parses the options, runs `lifecycle_fsm.audit` and prints its plan or summary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from lifecycle_fsm.cli.app import json_option, refuse_memory_db, root_obj, signing_key, wants_json
from lifecycle_fsm.cli.render import cells, console, emit
from lifecycle_fsm.cli.writes import ACTIVE_WINDOW, MAX_WINDOW_AGE
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display

if TYPE_CHECKING:
    from lifecycle_fsm.audit import AuditResult

__all__ = ["audit"]


_P = TypeVar("_P", Path, tuple[Path, ...])
_F = TypeVar("_F", bound=Callable[..., Any])


def _no_option_as_path(ctx: click.Context, param: click.Parameter, given: _P) -> _P:
    """A path spelled like one of this command's options is a usage error (a file so named: `./--label`):
    `--candidates --label X` would list a missing manifest `--label` and run on with the wrong options."""
    options = {name for p in ctx.command.params for name in p.opts if name.startswith("-")}
    for value in given if isinstance(given, tuple) else (given,):
        if str(value) in options:
            raise click.BadParameter(f"needs a path, not the option {value} (a file named so: ./{value})", ctx, param)
    return given


def _path_option(name: str, **kwargs: Any) -> Callable[[_F], _F]:
    return click.option(name, type=click.Path(path_type=Path), callback=_no_option_as_path, **kwargs)


@click.command()
@_path_option("--baseline", required=True, help="The SFT baseline manifest.")
@_path_option(
    "--candidates",
    multiple=True,
    required=True,
    metavar="M...",
    help="Candidate manifests (DPO, GRPO/RLVR); missing ones are listed in the records, not fatal.",
)
@click.argument("more_candidates", nargs=-1, type=click.Path(path_type=Path), metavar="[M]...")
@click.option("--label", required=True, help="Names the records: lifecycle_{evidence,handoff}_LABEL.json.")
@click.option("--mode", type=click.Choice(["dry_run", "real_artifact"]), default="dry_run", show_default=True)
@_path_option("--out", default=Path("results"), show_default=True, help="Folder for the records.")
@_path_option(
    "--root",
    default=Path("."),
    show_default="the current folder",
    help="Artifacts are read only inside ROOT (symlinks may point anywhere inside it).",
)
@click.option("--replace", is_flag=True, help="Move an existing record pair to <file>.previous first.")
@ACTIVE_WINDOW
@MAX_WINDOW_AGE
@json_option
def audit(candidates: tuple[Path, ...], more_candidates: tuple[Path, ...], mode: str, **request: Any) -> None:
    """Audit real candidate artifacts against an SFT baseline and write the hand-off records.

    `--candidates a.json b.json` and `--candidates a.json --candidates b.json` both work.
    dry_run (the default) checks the manifests and prints what real_artifact would do,
    writing nothing. real_artifact records every step as ledger events (baseline,
    window, receive, check, hand-off), then writes lifecycle_evidence_LABEL.json and
    lifecycle_handoff_LABEL.json to OUT. Exit 0 whenever the records were written,
    whatever they decide; a used LABEL is refused (exit 3) unless --replace.
    """
    from lifecycle_fsm.audit import AuditRequest, check_runnable, plan, prepare, run
    from lifecycle_fsm.ledger import Ledger

    prepared = prepare(AuditRequest(candidates=(*candidates, *more_candidates), **request))  # the other options
    if mode == "dry_run":
        doc = plan(prepared)
        emit(doc) if wants_json() else _print_plan(doc)
        return
    obj = root_obj()
    if not obj.get("db"):
        raise InputError("no ledger path: pass --db or set LIFECYCLE_DB")
    refuse_memory_db(obj["db"])
    key = signing_key()  # a bad key is refused before anything is made: the --out folder, the ledger
    check_runnable(prepared)  # before the ledger file is created
    with Ledger.open(
        obj["db"], synchronous=obj["synchronous"], actor=obj["actor"], artifact_root=request["root"]
    ) as ledger:
        result = run(prepared, ledger, signing_key=key)
    emit(_summary(result)) if wants_json() else _print_summary(result)


_SUMMARY_KEYS = ("candidate_id", "manifest_path", "handoff_status", "ledger_state", "reason_codes")


def _summary(result: AuditResult) -> JSON:
    return {
        "run_mode": "real_artifact",
        "run_label": result.evidence["run_label"],
        "evidence_path": str(result.evidence_path),
        "handoff_path": str(result.handoff_path),
        "handoff_status": result.handoff_status,
        "candidates": [{key: r[key] for key in _SUMMARY_KEYS} for r in result.evidence["candidate_records"]],
        "missing_candidate_manifests": result.evidence["missing_candidate_manifests"],
        "replaced": [str(p) for p in result.replaced],
    }


def _print_summary(result: AuditResult) -> None:
    from rich.table import Table

    table = Table("candidate", "kind", "ledger state", "hand-off", "reasons", "events")
    for r in result.evidence["candidate_records"]:
        seqs = ", ".join(str(e["seq"]) for e in r["ledger_events"]) or "-"
        reasons = ", ".join(r["reason_codes"]) or "-"
        row = (r["candidate_id"], str(r["candidate_kind"]), r["ledger_state"], str(r["handoff_status"]), reasons, seqs)
        table.add_row(*cells(*row))
    console().print(table)
    for missing in result.evidence["missing_candidate_manifests"]:
        _echo(f"missing candidate manifest (not audited): {missing}")
    for previous in result.replaced:
        _echo(f"previous record kept as {previous}")
    _echo(f"evidence: {result.evidence_path}")
    _echo(f"hand-off: {result.handoff_path} ({result.handoff_status})")


def _print_plan(doc: JSON) -> None:
    _echo(f"dry run for label {doc['run_label']}: nothing is written")
    _echo(f"baseline {doc['baseline_manifest']}: policy {doc['active_policy_version']}")
    rollback = doc["rollback"]
    _echo(f"  rollback adapter {rollback['path']}: {_where(rollback)}")
    for c in doc["candidates"]:
        failed = c["freshness_preview"]["failed_checks"]
        what = f"{c['candidate_kind']}, upstream {c['upstream_decision']}"
        _echo(f"candidate {c['candidate_id']} ({what}) from {c['manifest_path']}")
        _echo(f"  adapter {c['artifact']['path']}: {_where(c['artifact'])}")
        if c["missing_fields"]:
            _echo(f"  missing fields: {', '.join(c['missing_fields'])}")
        if failed:
            _echo(f"  would fail freshness: {', '.join(failed)}")
    for missing in doc["missing_candidate_manifests"]:
        _echo(f"missing candidate manifest (would be listed, not audited): {missing}")
    _echo("real_artifact would:")
    for step in doc["steps"]:
        _echo(f"  - {step}")
    for blocker in doc["blockers"]:
        _echo(f"real_artifact would be refused: {blocker}")


def _echo(line: str) -> None:
    """One line of the summary or the plan, whatever newline or escape a manifest's value holds."""
    click.echo(display(line))


def _where(path_plan: JSON) -> str:
    if path_plan["escapes_root"]:
        return "outside --root (will not be read: path_escapes_root)"
    return "exists" if path_plan["exists"] else "MISSING"
