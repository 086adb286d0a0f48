"""How a `transformers.Trainer` recovers: which stage failed, and what the ledger's plan means for it.

TRL has no sampling / reward / update boundaries of its own: a failure is an update
failure unless it was raised from a function wrapped by a `StageTracker` (a GRPO reward
function: reward; TRL's generation step: sampling).

The ledger plans recovery in the workflow's terms (prompt queues, trajectories, a
pre-update checkpoint, the verified baseline); a `Trainer` can resume from a
checkpoint folder or start over. This is how one becomes the other:

| plan action | trainer action |
|---|---|
| `restore_pre_update_checkpoint` | resume from the checkpoint the plan names (`plan.path`) |
| `retry_sampling_from_prompt_queue` | resume from the latest trusted checkpoint |
| `rebuild_prompt_queue` | resume from the latest trusted checkpoint |
| `resume_reward_from_saved_trajectories` | resume from the latest trusted checkpoint |
| `restart_sampling_from_prompt_queue` | resume from the latest trusted checkpoint |
| `restart_sampling` | resume from the latest trusted checkpoint |
| `rollback_to_verified_baseline` | load the SFT baseline's adapter into the model and train from step 0 |
| `block_update`, `block_release` | stop: the candidate is rejected, training is not retried |

A sampling or reward failure happens before the step's update, so the weights to go
on from are the latest checkpoint the ledger trusts: the plan names it (`plan.checkpoint`,
its `pre_update_checkpoint` re-hashed when the plan was made). Without one, or when its
bytes changed, training starts over from the SFT adapter, as after a rollback.

Whatever the trainer is put on (a checkpoint, the SFT adapter) is re-hashed just before
(`checked`): a plan can be followed long after it was made (a restarted run follows the one
an earlier run left, `left_plan`), and the baseline's adapter is only hashed when a plan
rolls back to it.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

import attrs

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.candidate_events import TrustedStateInvalidated, TrustedStateRecorded
from lifecycle_fsm.checks import ArtifactCheck, verify_artifact
from lifecycle_fsm.errors import InputError, NotFoundError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.machine import State, allowed_triggers
from lifecycle_fsm.rules import RecoveryAction, RecoveryPlan
from lifecycle_fsm.state import CandidateState, LedgerSettings

__all__ = [
    "CHECKPOINT",
    "ResumePoint",
    "StageTracker",
    "TRAINER_ACTIONS",
    "TrainerAction",
    "TrainingStopped",
    "checked",
    "existing",
    "left_plan",
    "load_baseline_adapter",
    "record_resumed",
    "resume_point",
    "start_over",
    "trusted_checkpoint",
]

F = TypeVar("F", bound=Callable[..., Any])
CHECKPOINT = "pre_update_checkpoint"  # the trusted-state kind a Trainer checkpoint is recorded as


@attrs.define
class StageTracker:
    """Which stage the last failure came from: `failed` is set by the first wrapped function that raised."""

    failed: str | None = None

    def wrap(self, stage: str, fn: F) -> F:
        """`fn`, marking a failure raised from it as a failure of `stage` (name and async-ness kept)."""

        def mark() -> None:
            if self.failed is None:
                self.failed = stage

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def staged_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception:
                    mark()
                    raise

            return staged_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def staged(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                mark()
                raise

        return staged  # type: ignore[return-value]


class TrainerAction(StrEnum):
    """What the trainer does after a failure (the module docstring's table)."""

    RESUME_FROM_PLAN = "resume_from_plan_checkpoint"
    RESUME_FROM_LATEST = "resume_from_latest_checkpoint"
    RESTART_FROM_BASELINE = "restart_from_baseline"
    STOP = "stop"


TRAINER_ACTIONS: dict[RecoveryAction, TrainerAction] = {
    RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT: TrainerAction.RESUME_FROM_PLAN,
    RecoveryAction.RETRY_SAMPLING_FROM_PROMPT_QUEUE: TrainerAction.RESUME_FROM_LATEST,
    RecoveryAction.REBUILD_PROMPT_QUEUE: TrainerAction.RESUME_FROM_LATEST,
    RecoveryAction.RESUME_REWARD_FROM_SAVED_TRAJECTORIES: TrainerAction.RESUME_FROM_LATEST,
    RecoveryAction.RESTART_SAMPLING_FROM_PROMPT_QUEUE: TrainerAction.RESUME_FROM_LATEST,
    RecoveryAction.RESTART_SAMPLING: TrainerAction.RESUME_FROM_LATEST,
    RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE: TrainerAction.RESTART_FROM_BASELINE,
    RecoveryAction.BLOCK_UPDATE: TrainerAction.STOP,
    RecoveryAction.BLOCK_RELEASE: TrainerAction.STOP,
}


@attrs.frozen
class ResumePoint:
    """Where every rank goes on from: `checkpoint` for `trainer.train(resume_from_checkpoint=...)`,
    or `baseline_adapter` to load before training from step 0; `sha256`: the digest the ledger
    trusts for that folder; `why` says how it was chosen."""

    plan: RecoveryPlan
    action: TrainerAction
    checkpoint: str | None = None
    baseline_adapter: str | None = None
    why: str = ""
    sha256: str | None = None


class TrainingStopped(RuntimeError):
    """Training was not resumed: the plan blocks the candidate, or the attempts ran out."""

    def __init__(self, message: str, point: ResumePoint | None = None) -> None:
        super().__init__(message)
        self.point = point


def _baseline(plan: RecoveryPlan, settings: LedgerSettings, why: str) -> ResumePoint:
    if plan.recovery_state == "verified_baseline" and plan.path is not None:
        adapter, sha256 = plan.path, plan.sha256  # as the plan re-hashed it
    elif settings.baseline is not None:
        adapter, sha256 = str(settings.baseline["adapter_path"]), str(settings.baseline["adapter_sha256"])
    else:
        return ResumePoint(plan, TrainerAction.STOP, why=f"{why}, and the ledger has no active baseline")
    return ResumePoint(plan, TrainerAction.RESTART_FROM_BASELINE, baseline_adapter=adapter, why=why, sha256=sha256)


def resume_point(plan: RecoveryPlan, settings: LedgerSettings) -> ResumePoint:
    """The trainer action for `plan` (the module docstring's table), from what the plan recorded."""
    action = TRAINER_ACTIONS[plan.action]
    if action is TrainerAction.STOP:
        return ResumePoint(plan, action, why=f"the plan {plan.action} blocks the candidate")
    if action is TrainerAction.RESUME_FROM_PLAN:
        return ResumePoint(plan, action, checkpoint=plan.path, why="the plan names the checkpoint", sha256=plan.sha256)
    if action is TrainerAction.RESTART_FROM_BASELINE:
        return _baseline(plan, settings, "the plan rolls back to the verified baseline")
    if plan.checkpoint is None:
        return _baseline(plan, settings, "no trusted checkpoint to resume from (none recorded, or its bytes changed)")
    return ResumePoint(
        plan, action, checkpoint=plan.checkpoint, why="the latest trusted checkpoint", sha256=plan.checkpoint_sha256
    )


def _rehashed(point: ResumePoint, root: str | None) -> ArtifactCheck | None:
    """The folder `point` puts the trainer on, re-hashed now against the digest the ledger trusts."""
    folder = point.checkpoint or point.baseline_adapter
    return None if folder is None else verify_artifact(folder, point.sha256, root)


def checked(point: ResumePoint, root: str | None) -> ResumePoint:
    """`point`, or a stop when what it loads is not what the ledger trusts (re-hashed now: other bytes, gone,
    or unreadable)."""
    check = _rehashed(point, root)
    if check is None or check.verified:
        return point
    found = check.error or f"recorded {point.sha256}, now {check.actual}"
    return ResumePoint(point.plan, TrainerAction.STOP, why=f"{check.path} is not what the ledger trusts ({found})")


def left_plan(ledger: Ledger, candidate_id: str, run_id: str, kind: str, *, fresh: bool) -> ResumePoint | None:
    """Where the plan an earlier run left takes the trainer (its candidate still recovering); None without
    one (then, `fresh`, see `start_over`). A checkpoint it names that holds other bytes now is planned
    again (once: the new plan passes it over); one gone or unreadable (a volume not mounted yet) stops
    training and writes nothing, and so does a changed SFT adapter (planning again cannot mend it)."""
    current = existing(ledger, candidate_id, kind)
    plan = None if current is None else ledger.recovery_plan(candidate_id)
    if current is None or current.state is not State.RECOVERING or plan is None:
        if fresh and current is not None:
            start_over(ledger, current)
        return None
    point = resume_point(plan, ledger.settings())
    check = _rehashed(point, ledger.artifact_root)
    if point.checkpoint is not None and check is not None and check.actual is not None and not check.verified:
        again = ledger.fail_stage(candidate_id, plan.stage, event_id=f"{run_id}/plan-{plan.seq}/planned-again")
        point = resume_point(again.plan, ledger.settings())
    return checked(point, ledger.artifact_root)


def record_resumed(ledger: Ledger, candidate_id: str, folder: str, sha256: str, key: str) -> None:
    """A caller's `resume_from_checkpoint`, loaded by the trainer: recorded again as the latest trusted
    checkpoint, so a later failure goes back to it, not to one the abandoned run saved past it."""
    now = hash_directory(folder, ledger.artifact_root)
    if now != sha256:
        raise InputError(f"{folder}: its bytes changed while the trainer loaded it (recorded {sha256}, now {now})")
    ledger.record_trusted_state(candidate_id, CHECKPOINT, folder, event_id=key)


def load_baseline_adapter(trainer: Any, adapter: str) -> None:
    """Put the SFT adapter's weights back into the trainer's PEFT model and drop its optimizer state."""
    from peft import PeftModel, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    model = trainer.model
    if not isinstance(model, PeftModel):
        raise TypeError(
            f"rolling back to the SFT adapter needs a PEFT model to load it into; the trainer holds a "
            f"{type(model).__name__}"
        )
    set_peft_model_state_dict(model, load_peft_weights(adapter, device="cpu"))
    trainer.optimizer = None  # a fresh optimizer and schedule for the new start (the Trainer creates them)
    trainer.lr_scheduler = None


def trusted_checkpoint(ledger: Ledger, candidate_id: str, asked: object) -> tuple[str, str]:
    """The checkpoint a caller's `resume_from_checkpoint` names and its digest, once the ledger trusts it: recorded for
    this candidate (since its checkpoints were last invalidated) and holding those bytes now; `True`
    is the latest such record. Anything else is refused: training never resumes from bytes the ledger
    did not record (a checkpoint edited after a crash, or saved but not recorded yet). A recorded
    folder that is gone is passed over for the one before it."""
    records: dict[str, str] = {}  # path -> sha256, oldest record first
    if existing(ledger, candidate_id) is not None:
        for e in ledger.events(stream=candidate_id):
            event = e.event
            if isinstance(event, TrustedStateInvalidated) and event.kind == CHECKPOINT:
                records.clear()
            elif isinstance(event, TrustedStateRecorded) and event.kind == CHECKPOINT:
                records.pop(event.path, None)
                records[event.path] = event.sha256
    if asked is True:
        on_disk = [p for p in reversed(records) if os.path.isdir(p)]  # one rotated away (save_total_limit) is skipped
        if not on_disk:
            gone = f" (recorded, now gone: {', '.join(records)})" if records else ""
            raise InputError(
                f"resume_from_checkpoint=True: the ledger holds no checkpoint of candidate {candidate_id!r} "
                f"to resume from{gone}; train without resume_from_checkpoint to start over"
            )
        path = on_disk[0]
    else:
        if not isinstance(asked, str | os.PathLike):
            raise InputError(f"resume_from_checkpoint must be a folder or True, not {asked!r}")
        real = os.path.realpath(os.fspath(asked))  # the folder, however it is named (a link, a relative path)
        path = next((p for p in reversed(records) if os.path.realpath(p) == real), "")
        if not path:
            raise InputError(
                f"resume_from_checkpoint {os.fspath(asked)}: not a checkpoint the ledger recorded for candidate "
                f"{candidate_id!r}; resume from one it trusts ({', '.join(records) or 'none yet'})"
            )
    now = hash_directory(path, ledger.artifact_root)
    if now != records[path]:
        raise InputError(
            f"resume_from_checkpoint {path}: its bytes changed since the ledger recorded them (recorded "
            f"{records[path]}, now {now}); not resuming from it"
        )
    return path, now


def start_over(ledger: Ledger, current: CandidateState) -> None:
    """Training starts over (no resume_from_checkpoint, no plan left): a checkpoint an earlier run recorded is
    not this run's state, so a failure must not resume from it. It is invalidated, the reason in the log."""
    training = "fail_stage" in allowed_triggers(current.state.value)  # else refused at train begin
    if training and CHECKPOINT in current.trusted_states:
        reason = "training started over without resume_from_checkpoint"
        ledger.invalidate_trusted_state(current.candidate_id, CHECKPOINT, reason)


def existing(ledger: Ledger, candidate_id: str, kind: str | None = None) -> CandidateState | None:
    """The candidate as the ledger holds it, None before it is registered; one of another `kind` than a run
    training it is refused."""
    try:
        found = ledger.candidate(candidate_id)
    except NotFoundError:
        return None
    if kind is not None and found.kind != kind:
        raise InputError(f"candidate {candidate_id!r} exists as a {found.kind} candidate, not {kind}")
    return found
