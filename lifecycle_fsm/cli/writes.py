"""Commands that append to the ledger (its settings, each candidate's moves): each calls one `Ledger` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from lifecycle_fsm.cli.app import SuggestingGroup, json_option, open_ledger, wants_json
from lifecycle_fsm.cli.exit_codes import decision_exit_code
from lifecycle_fsm.cli.render import NO_CHANGE, emit, print_result
from lifecycle_fsm.limits import MAX_INT64, display
from lifecycle_fsm.rules import STAGES

if TYPE_CHECKING:
    from lifecycle_fsm.results import CandidateResult

__all__ = [
    "ACTIVE_WINDOW",
    "MAX_WINDOW_AGE",
    "baseline",
    "baseline_activate",
    "check",
    "evaluation",
    "evaluation_activate",
    "event_id_option",
    "fail",
    "handoff",
    "init",
    "receive",
    "recovered",
    "trusted",
    "untrust",
    "window",
]


event_id_option = click.option(
    "--event-id",
    help="Idempotency key (global across the ledger, e.g. <run>/<step>/<command>): "
    "a retry with the same key appends nothing and reports the first outcome. "
    "A key may not end in /<number>: a command's further events are keyed KEY/1, KEY/2, ...",
)
# The seed's defaults (`Ledger.init`'s; tests/test_cli.py holds them equal).
MAX_WINDOW_AGE = click.option("--max-window-age", default=2, show_default=True, type=click.IntRange(0, MAX_INT64))
ACTIVE_WINDOW = click.option("--active-window", default=1, show_default=True, type=click.IntRange(0, MAX_INT64))


@click.command()
@MAX_WINDOW_AGE
@ACTIVE_WINDOW
@event_id_option
@json_option
def init(max_window_age: int, active_window: int, event_id: str | None) -> None:
    """Create the ledger and fix its freshness settings."""
    print_result(open_ledger(initialising=True).init(max_window_age, active_window, event_id=event_id), "initialized")


@click.group(cls=SuggestingGroup)
def baseline() -> None:
    """The active SFT baseline."""


@baseline.command("activate")
@click.argument("sft_manifest", type=click.Path(path_type=Path))
@event_id_option
@json_option
def baseline_activate(sft_manifest: Path, event_id: str | None) -> None:
    """Make SFT_MANIFEST's adapter the active policy; decided candidates must be re-checked.

    A candidate's manifest (a DPO or GRPO semantic_id) or a delivery whose decision is reject is refused.
    """
    from lifecycle_fsm.manifests import load_baseline_manifest

    load_baseline_manifest(sft_manifest)  # bad input fails before a ledger file is created
    print_result(open_ledger().activate_baseline(sft_manifest, event_id=event_id), "baseline activated")


@click.command()
@click.argument("n", type=click.IntRange(0, MAX_INT64))
@event_id_option
@json_option
def window(n: int, event_id: str | None) -> None:
    """Advance the active rollout window to N (online candidates must be re-checked)."""
    print_result(open_ledger().advance_window(n, event_id=event_id), "window advanced")


@click.group(cls=SuggestingGroup)
def evaluation() -> None:
    """The evaluation version candidates must name."""


@evaluation.command("activate")
@click.argument("version")
@event_id_option
@json_option
def evaluation_activate(version: str, event_id: str | None) -> None:
    """Require VERSION as every candidate's evaluation_version from now on."""
    print_result(open_ledger().activate_evaluation(version, event_id=event_id), "evaluation activated")


@click.command()
@click.argument("candidate_manifest", type=click.Path(path_type=Path))
@click.option(
    "--id",
    "candidate_id",
    help="Candidate id (default: the manifest's policy_version; without one, the manifest's path as given, "
    "and its check rejects it for candidate_identity).",
)
@event_id_option
@json_option
def receive(candidate_manifest: Path, candidate_id: str | None, event_id: str | None) -> None:
    """Receive a candidate manifest (identical re-receipt is a no-op)."""
    from lifecycle_fsm.manifests import load_candidate_manifest

    load_candidate_manifest(candidate_manifest)  # bad input fails before a ledger file is created
    print_result(open_ledger().receive(candidate_manifest, candidate_id=candidate_id, event_id=event_id), "received")


_REHASH = click.option(
    "--rehash",
    is_flag=True,
    help="Read every byte of the artifacts (a one-command process always does; an embedding Ledger "
    "re-uses a digest while no file's inode, size, mtime or ctime changed).",
)
_EXIT_STATUS = click.option(
    "--exit-status",
    is_flag=True,
    help="Exit with the decision, so a script can gate on it: 0 only for a pass (check) or ready (handoff); "
    "10 tune, 11 reject, 12 inconclusive (an artifact could not be read for a reason of the environment).",
)


def _decided(command: str, result: CandidateResult, exit_status: bool) -> None:
    """With `--exit-status`, end with the code of the decision just printed."""
    if exit_status and (code := decision_exit_code(command, result.state, inconclusive=result.inconclusive)):
        sys.exit(int(code))


@click.command()
@click.argument("candidate_id", metavar="ID")
@event_id_option
@_REHASH
@_EXIT_STATUS
@json_option
def check(candidate_id: str, event_id: str | None, rehash: bool, exit_status: bool) -> None:
    """Run every check now: lineage, freshness, artifact and rollback re-hash."""
    result = open_ledger(must_exist=True).check(candidate_id, event_id=event_id, rehash=rehash)
    print_result(result, "checked")
    _decided("check", result, exit_status)


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.argument("kind", metavar="KIND")
@click.argument("path", type=click.Path(path_type=Path))
@event_id_option
@json_option
def trusted(candidate_id: str, kind: str, path: Path, event_id: str | None) -> None:
    """Record a trusted state (KIND at PATH, hashed now) that recovery may resume from.

    KIND is one of prompt_queue, trajectories, pre_update_checkpoint, verified_baseline.
    """
    result = open_ledger(must_exist=True).record_trusted_state(candidate_id, kind, path, event_id=event_id)
    print_result(result, f"trusted {kind} recorded")


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.argument("kind", metavar="KIND")
@click.option("--reason", default="invalidated by operator", show_default=True)
@event_id_option
@json_option
def untrust(candidate_id: str, kind: str, reason: str, event_id: str | None) -> None:
    """Invalidate a recorded trusted state (it stays in history)."""
    result = open_ledger(must_exist=True).invalidate_trusted_state(candidate_id, kind, reason, event_id=event_id)
    print_result(result, f"{kind} invalidated")


@click.command()
@click.argument("candidate_id", metavar="ID")
@click.option("--stage", required=True, help=f"The training stage that failed: {', '.join(STAGES)}.")
@event_id_option
@json_option
def fail(candidate_id: str, stage: str, event_id: str | None) -> None:
    """Report a failed stage; prints the recovery plan from the latest trusted state."""
    result = open_ledger(must_exist=True).fail_stage(candidate_id, stage, event_id=event_id)
    plan = result.plan  # the plan this command recorded (a retried --event-id returns the original one)
    recorded = next(orjson.loads(e.payload) for e in result.events if e.type == "RecoveryPlanned")
    doc = {
        "id": candidate_id,
        "stage": plan.stage,
        "recovery_state": plan.recovery_state,
        "reused_state": plan.reused_state,
        "action": str(plan.action),
        "state": str(result.state),
        "path": plan.path,
        "sha256": plan.sha256,
        "blocking": plan.blocking,
        "skipped": [{"kind": kind, "reason": reason} for kind, reason in plan.skipped],
        "trusted_states": recorded["trusted_states"],
        "appended": result.appended,  # False for a retried --event-id: the plan and events are the first call's
        "events": [e.seq for e in result.events],
    }
    if wants_json():
        emit(doc)
        return
    reused = f"reuse {plan.recovery_state}" if plan.reused_state else "no trusted state to reuse"
    what = f"{display(candidate_id)}: {plan.stage} failed -> {plan.action} ({reused}); state {doc['state']}"
    click.echo(what if result.appended else what + NO_CHANGE)


@click.command()
@click.argument("candidate_id", metavar="ID")
@event_id_option
@json_option
def recovered(candidate_id: str, event_id: str | None) -> None:
    """The planned recovery finished; the candidate must be checked again."""
    print_result(open_ledger(must_exist=True).complete_recovery(candidate_id, event_id=event_id), "recovered")


@click.command()
@click.argument("candidate_id", metavar="ID")
@event_id_option
@_REHASH
@_EXIT_STATUS
@json_option
def handoff(candidate_id: str, event_id: str | None, rehash: bool, exit_status: bool) -> None:
    """Re-run the checks and decide: ready (for evaluation), tune or reject."""
    result = open_ledger(must_exist=True).hand_off(candidate_id, event_id=event_id, rehash=rehash)
    print_result(result, "handed off")
    _decided("handoff", result, exit_status)
