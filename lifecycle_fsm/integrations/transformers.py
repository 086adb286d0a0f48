"""`LedgerCallback`: a `transformers` / TRL trainer that records its candidate in the ledger as it trains.

What it records and when (the candidate and its provenance card at train begin, each checkpoint
as a trusted state, each failure and its recovery, the hand-off at `finish`) and how ranks share
the work under DDP: docs/embedding.md, "The trainer integration". A failure raised on one rank
only is not seen by the others: they wait in their next collective, as torch.distributed does.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import IllegalCommandError, InputError, LifecycleError
from lifecycle_fsm.integrations.handoff import manifest_defaults, may_finish, refuse_filled
from lifecycle_fsm.integrations.provenance import provenance_card
from lifecycle_fsm.integrations.recorder import (
    MainProcessError,
    PendingRecord,
    TrustedStateRecorder,
    barrier,
    on_main,
)
from lifecycle_fsm.integrations.recovery import (
    CHECKPOINT,
    ResumePoint,
    StageTracker,
    TrainerAction,
    TrainingStopped,
    checked,
    existing,
    left_plan,
    load_baseline_adapter,
    record_resumed,
    resume_point,
    trusted_checkpoint,
)
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.limits import check_int
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.machine import State, allowed_triggers
from lifecycle_fsm.manifests import candidate_manifest, check_kind, write_manifest
from lifecycle_fsm.results import CandidateResult

__all__ = ["LedgerCallback", "TrainingStopped"]

F = TypeVar("F", bound=Callable[..., Any])
log = get_logger(__name__)

ADAPTER_FOLDER = "candidate-adapter"
MANIFEST_FILE = "candidate-manifest.json"


class LedgerCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]  # Any where transformers is absent
    """Records a training run's candidate, checkpoints, failures and hand-off in `ledger`.

    `kind` is dpo, grpo or rlvr; `run_id` names the run in every idempotency key (a
    restarted run is a new attempt, so its re-saved checkpoints are new records);
    `candidate_id` defaults to `run_id`; `max_attempts` bounds `train`'s retries.
    `dataset`: the dataset the provenance card fingerprints, when not the trainer's own
    (TRL trains on a tokenized copy, whose fingerprint `datasets` may draw at random).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        kind: str,
        run_id: str,
        candidate_id: str | None = None,
        max_attempts: int = 3,
        code_folder: str | os.PathLike[str] | None = None,
        dataset: Any = None,
    ) -> None:
        self.kind = check_kind(kind)
        if not isinstance(run_id, str) or not run_id.strip():
            raise InputError(f"run_id must be a non-empty string, not {run_id!r}")
        self.ledger = ledger
        self.run_id = run_id
        self.candidate_id = candidate_id if candidate_id is not None else run_id
        self.max_attempts = check_int("max_attempts", max_attempts, minimum=1)
        self.code_folder = code_folder
        self.dataset = dataset
        self.attempt = 0  # this run's attempt, counted in the ledger (main process)
        self.card: JSON | None = None  # the provenance card recorded at registration (main process)
        self.resumed: list[ResumePoint] = []  # each failure's plan and where training went on from (every rank)
        self._trainer: Trainer | None = None
        self._registered: JSON | None = None  # what the candidate was registered against (main process)
        self._recorder: TrustedStateRecorder | None = None
        self._deferred: BaseException | None = None  # a record failure kept for the next collective boundary
        self._stages = StageTracker()
        self._began = False
        self._hook_failed = False
        self._on_loaded: Callable[[], None] | None = None  # recorded once the trainer loaded its start (main)

    # --- stages ------------------------------------------------------------------

    def reward_function(self, fn: F) -> F:
        """Wrap a GRPO reward function: its failures are `reward` stage failures (its name is kept)."""
        return self._stages.wrap("reward", fn)

    def generation_hook(self, trainer: Trainer) -> None:
        """Make failures in TRL's generation step (`_generate` of GRPO/RLOO trainers) `sampling` failures."""
        generate = getattr(trainer, "_generate", None)
        if not callable(generate):
            raise InputError(f"{type(trainer).__name__} has no generation step (_generate) to watch")
        setattr(trainer, "_generate", self._stages.wrap("sampling", generate))  # noqa: B010 - TRL's own attribute

    # --- collective steps -----------------------------------------------------------

    def _collective(self, is_main: bool, step: Callable[[], Any]) -> Any:
        """`on_main`, remembering that a failure came from this callback, not from training."""
        try:
            return on_main(is_main, step)
        except BaseException:
            self._hook_failed = True
            raise

    def _drain(self) -> None:
        """Wait for queued records; keep a failure for the next collective boundary."""
        if self._recorder is not None:
            try:
                self._recorder.wait()
            except Exception as e:
                self._deferred = self._deferred or e

    def _raise_deferred(self) -> None:
        error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def _settle_records(self) -> None:
        """Wait for queued records and raise the first that failed."""
        self._drain()
        self._raise_deferred()

    # --- TrainerCallback events -----------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._began = True
        self._collective(state.is_world_process_zero, lambda: self._begin(args, kwargs))

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if control.should_save and state.is_world_process_zero:
            self._drain()  # before the save rotates old checkpoints away under a record still hashing

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_save and state.is_world_process_zero:
            self._drain()  # an epoch's save rotates too

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._drain()  # a save by the best metric may follow at once

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        ending = control.should_training_stop or (state.max_steps and state.global_step >= state.max_steps)
        if ending and state.is_world_process_zero:
            self._drain()  # the last log comes before the Trainer's clean-up removes checkpoints

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        barrier()  # every rank calls on_save once its own files are written
        self._collective(state.is_world_process_zero, lambda: self._record_checkpoint(args, state.global_step))
        if state.is_world_process_zero and state.max_steps and state.global_step >= state.max_steps:
            self._drain()  # the last save: the Trainer's clean-up at the end may remove checkpoints

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._collective(state.is_world_process_zero, self._settle_records)

    # --- what the main process does ----------------------------------------------------

    def _begin(self, args: TrainingArguments, objects: JSON) -> None:
        if self._registered is None:
            self._register(args, objects)
        self.attempt = self._next_attempt()
        log.info("training_attempt_started", candidate_id=self.candidate_id, run_id=self.run_id, attempt=self.attempt)
        loaded, self._on_loaded = self._on_loaded, None
        if loaded is not None:  # train begins once the Trainer loaded the checkpoint (or the adapter was loaded)
            loaded()

    def _register(self, args: TrainingArguments, objects: JSON) -> None:
        trainer = self._trainer
        dataset = self.dataset
        if dataset is None:
            dataset = (
                trainer.train_dataset
                if trainer is not None
                else getattr(objects.get("train_dataloader"), "dataset", None)
            )
        self.card = provenance_card(
            dataset=dataset,
            model=objects.get("model"),
            tokenizer=objects.get("processing_class"),
            arguments=args,
            trainer_class=None if trainer is None else type(trainer),
            code_folder=self.code_folder,
        )
        settings = self.ledger.settings()
        source = settings.active_policy_version
        found = existing(self.ledger, self.candidate_id, self.kind)
        if found is not None:  # a restarted run goes on with its candidate
            if "fail_stage" not in allowed_triggers(found.state.value):  # handed off, or decided
                raise IllegalCommandError(
                    f"candidate {self.candidate_id!r} is {found.state.value}: its training is over (a failure "
                    "could no longer be recovered); train a new candidate (another run_id or candidate_id)",
                    state=found.state.value,
                    trigger="fail_stage",
                )
            source = found.candidate.get("source_policy_version", source)
        elif source is None:
            raise InputError("no active baseline: activate the SFT baseline's manifest before training a candidate")
        else:
            self.ledger.register(
                self.candidate_id,
                kind=self.kind,
                source_policy_version=source,
                provenance=self.card,
                event_id=f"{self.run_id}/register",
            )
        self._registered = {"source_policy_version": source, "active_window": settings.active_window}
        if self.ledger.location is None:
            raise InputError(
                "LedgerCallback needs a ledger opened by path or URL (Ledger.open): its records are "
                "made on a thread of its own, which opens the same ledger"
            )
        self._recorder = TrustedStateRecorder(
            self.ledger.location, actor=self.ledger.actor, artifact_root=self.ledger.artifact_root
        )

    def _next_attempt(self) -> int:
        """One more than the highest attempt any key of this run names (a restarted process counts on)."""
        pattern = re.compile(re.escape(self.run_id) + r"/attempt-(\d+)/")
        used = (pattern.match(e.event_id or "") for e in self.ledger.events(stream=self.candidate_id))
        return max((int(m.group(1)) for m in used if m), default=0) + 1

    def _key(self, what: str) -> str:
        return f"{self.run_id}/attempt-{self.attempt}/{what}"

    def _record_checkpoint(self, args: TrainingArguments, step: int) -> None:
        self._raise_deferred()
        folder = os.path.abspath(os.path.join(_output_dir(args), f"checkpoint-{step}"))
        if not os.path.isdir(folder):
            raise InputError(f"the trainer saved step {step} but there is no checkpoint folder {folder}")
        assert self._recorder is not None  # registered at train begin
        self._recorder.submit(
            PendingRecord(self.candidate_id, CHECKPOINT, folder, self._key(f"step-{step}/checkpoint"))
        )

    def _recover(self, error: BaseException) -> ResumePoint:
        """Record the failure and its plan (the recovery is completed once the trainer follows it)."""
        self._settle_records()
        stage = self._stages.failed or "update"
        failed = self.ledger.fail_stage(self.candidate_id, stage, event_id=self._key(f"fail/{stage}"))
        point = checked(resume_point(failed.plan, self.ledger.settings()), self.ledger.artifact_root)
        log.warning(
            "training_failed",
            candidate_id=self.candidate_id,
            attempt=self.attempt,
            stage=stage,
            error=repr(error),
            plan=str(failed.plan.action),
            trainer_action=str(point.action),
            why=point.why,
        )
        return point

    def _complete_recovery(self, point: ResumePoint, key: str) -> None:
        """Record that training goes on from `point`, once the trainer is there."""
        if point.action is not TrainerAction.STOP:
            resumed_from = point.checkpoint or point.baseline_adapter
            self.ledger.complete_recovery(self.candidate_id, resumed_from=resumed_from, event_id=key)

    # --- the two calls a training script makes -------------------------------------------

    def train(self, trainer: Trainer, **train_kwargs: Any) -> Any:
        """`trainer.train(**train_kwargs)`, recovering from failures as the ledger plans, up to `max_attempts`; a
        run restarted while its candidate is still recovering first follows the plan left in the ledger."""
        self._trainer, self._on_loaded = trainer, None  # nothing an earlier call left pending
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:  # last: a checkpoint is recorded once every other on_save wrote into it
            callbacks.remove(self)
            callbacks.append(self)
        is_main = trainer.is_world_process_zero()
        resume = train_kwargs.pop("resume_from_checkpoint", None)
        fresh = resume is None or resume is False
        left: ResumePoint | None = self._collective(
            is_main, functools.partial(left_plan, self.ledger, self.candidate_id, self.run_id, self.kind, fresh=fresh)
        )
        if left is not None:
            resume = self._follow(trainer, left, None, resume)
            key = f"{self.run_id}/plan-{left.plan.seq}/recovered"
            self._on_loaded = functools.partial(self._complete_recovery, left, key)
        elif resume is not None and resume is not False:
            folder, sha = self._collective(is_main, lambda: trusted_checkpoint(self.ledger, self.candidate_id, resume))
            resume = folder  # recorded again once loaded, under the attempt counted then
            self._on_loaded = lambda: record_resumed(self.ledger, self.candidate_id, folder, sha, self._key("resumed"))
        for attempt in range(1, self.max_attempts + 1):
            self._stages.failed, self._began, self._hook_failed = None, False, False
            try:
                return trainer.train(resume_from_checkpoint=resume, **train_kwargs)
            except (KeyboardInterrupt, SystemExit):
                if is_main:
                    self._drain()  # the checkpoints saved before the interrupt are still recorded
                raise
            except Exception as error:
                if self._hook_failed or not self._began or isinstance(error, LifecycleError | MainProcessError):
                    raise  # the ledger refused, or training never started: not a training stage failure
                final = attempt == self.max_attempts
                point: ResumePoint = self._collective(is_main, functools.partial(self._recover, error))
                if final and point.action is not TrainerAction.STOP:
                    raise TrainingStopped(
                        f"training failed {attempt} times; the last plan was {point.plan.action}", point
                    ) from error
                resume = self._follow(trainer, point, error, resume)  # completed once the trainer loaded it
                self._on_loaded = functools.partial(self._complete_recovery, point, self._key("recovered"))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _follow(self, trainer: Trainer, point: ResumePoint, error: BaseException | None, resume: Any) -> Any:
        """Act on a resume point (every rank); the checkpoint to resume from next."""
        self.resumed.append(point)
        if point.action is TrainerAction.STOP:
            raise TrainingStopped(f"training stopped: {point.why}", point) from error
        if point.action is TrainerAction.RESTART_FROM_BASELINE:
            assert point.baseline_adapter is not None
            load_baseline_adapter(trainer, point.baseline_adapter)
        return point.checkpoint

    def finish(self, trainer: Trainer, decision: str = "accept", **manifest_fields: Any) -> CandidateResult:
        """Save the adapter, write its manifest, complete the candidate, check it and hand it off.

        The adapter goes to `<output_dir>/candidate-adapter`, the manifest beside it; keyword
        fields (`evaluation_version`, `verifier_version`, `source_evidence_version`, ...) override
        the defaults. Returns the hand-off's result, or the check's when the check rejected it.
        """
        adapter = os.path.abspath(os.path.join(_output_dir(trainer.args), ADAPTER_FOLDER))
        refuse_filled(manifest_fields)
        is_main = trainer.is_world_process_zero()
        received = self._collective(
            is_main,
            lambda: may_finish(
                self.ledger, self.candidate_id, self._registered, adapter, MANIFEST_FILE, decision, manifest_fields
            ),
        )
        if not received:
            trainer.save_model(adapter)  # every rank: the Trainer writes from the main process
            barrier()
        hand_off = functools.partial(self._hand_off, adapter, decision, manifest_fields, write=not received)
        result: CandidateResult = self._collective(is_main, hand_off)
        return result

    def _hand_off(self, adapter: str, decision: str, fields: JSON, *, write: bool) -> CandidateResult:
        """Write the manifest (unless the candidate received its adapter already), then receive, check and
        hand off: each under the run's key, so a repeated `finish` answers with what was recorded."""
        if self._recorder is not None:
            self._recorder.close()
        assert self._registered is not None  # refused by may_finish before anything was saved
        root = self.ledger.artifact_root
        manifest_path = os.path.join(os.path.dirname(adapter), MANIFEST_FILE)
        settings = self.ledger.settings()
        chosen = manifest_defaults(self.kind, self.card, self._registered, settings.evaluation_version) | fields
        if write:
            manifest = candidate_manifest(
                candidate_id=self.candidate_id,
                kind=self.kind,
                adapter_path=os.path.relpath(adapter, root or os.path.dirname(manifest_path)),
                adapter_sha256=hash_directory(adapter, root),
                decision=decision,
                **chosen,
            )
            write_manifest(manifest_path, manifest)
        cid = self.candidate_id
        self.ledger.receive(manifest_path, candidate_id=cid, event_id=f"{self.run_id}/receive")
        checked = self.ledger.check(cid, event_id=f"{self.run_id}/check")
        if checked.state is not State.VERIFIED:
            return checked
        return self.ledger.hand_off(cid, event_id=f"{self.run_id}/handoff")


def _output_dir(args: TrainingArguments) -> str:
    if not args.output_dir:
        raise InputError("the trainer's arguments name no output_dir: checkpoints and the adapter are written there")
    return str(args.output_dir)
