"""The simulator's reference model: what the ledger must do, written from the documented rules (only
`lifecycle_fsm.rules`, never the table, the fold or the decisions), and which artifacts are intact."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from lifecycle_fsm import rules
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.rules import TRUSTED_STATE_KINDS as KINDS

DECIDED = ("verified", "ready", "tune")  # what a settings change invalidates
ALIVE = ("received", "verified", "recovering", "ready", "tune")


@attrs.define
class CandidateModel:
    """One candidate as it must be."""

    artifact: str
    kind: str
    fields: JSON = attrs.Factory(dict)  # what the manifest said when it was (last) received
    path: list[str] = attrs.Factory(lambda: ["received"])  # its state after each of its events
    trusted: dict[str, tuple[str, int]] = attrs.Factory(dict)  # kind -> (folder artifact, its content then)
    plan: JSON | None = None
    pending: bool = False  # registered, its adapter not received yet

    @property
    def state(self) -> str:
        return self.path[-1]

    @property
    def version(self) -> int:
        return len(self.path)


@attrs.frozen
class Prediction:
    """What a command must do: refused (any of `errors`), or accepted with `events` appended."""

    errors: tuple[str, ...] = ()  # non-empty: it must be refused with one of these classes
    events: int = 0
    states: Mapping[str, tuple[str, int]] = attrs.Factory(dict)  # candidate -> (state, version) after
    plan: JSON | None = None
    apply: Callable[[], Any] = lambda: None  # commits the change to the model

    @property
    def refused(self) -> bool:
        return bool(self.errors)


@attrs.define
class LedgerModel:
    """The whole ledger plus the disk, as the specification describes them."""

    baselines: dict[str, str]  # baseline artifact -> its adapter's sha256 (its policy version)
    specs: dict[str, JSON]  # candidate artifact -> {kind, source, decision, window_index, evaluation, sha_ok}
    max_window_age: int = 2
    active_window: int = 1
    active_baseline: str | None = None
    activated: set[str] = attrs.Factory(set)  # every baseline ever activated
    evaluation: str | None = None
    events: int = 1  # LedgerInitialized
    candidates: dict[str, CandidateModel] = attrs.Factory(dict)
    content: dict[str, int | None] = attrs.Factory(dict)  # artifact -> 0 intact, n tampered, None deleted
    tampers: int = 0
    checkpoints: int = 0
    corrupted: bool = False  # a checkpoint was garbled: verify must name it
    tampered_seq: int | None = None  # an event was edited: verify must name its seq

    def intact(self, artifact: str | None) -> bool:
        return self.content.get(artifact or "", 0) == 0

    def tamper(self, artifact: str) -> None:
        self.tampers += 1
        self.content[artifact] = self.tampers  # bytes no earlier state of this file had

    def delete(self, artifact: str) -> None:
        self.content[artifact] = None

    def restore(self, artifact: str) -> None:
        self.content[artifact] = 0

    def edit(self, artifact: str, manifest: Mapping[str, Any]) -> None:
        """A manifest rewritten in place: what the model reads from it changes."""
        keys = {"evidence_window_index": "window_index", "evaluation_version": "evaluation"}
        self.specs[artifact] = self.specs[artifact] | {keys.get(k, k): v for k, v in manifest.items()}

    def _freshness(self, c: CandidateModel) -> JSON:
        f = c.fields
        index = f.get("window_index")
        candidate = {
            "candidate_kind": c.kind,
            "source_policy_version": self.baselines.get(f["source"]),
            "policy_version": c.artifact,
            "evaluation_version": f["evaluation"],
            "preference_evidence_version": "pref" if c.kind == "dpo" else None,
            "verifier_version": "verifier" if c.kind != "dpo" else None,
            "window_age": self.active_window - index if isinstance(index, int) else None,
        }
        active = self.baselines[self.active_baseline] if self.active_baseline else ""
        result = rules.check_candidate_freshness(candidate, active, self.max_window_age)
        if self.evaluation is not None and f["evaluation"] != self.evaluation:  # an activated one is identity
            failed = set(result["failed_checks"]) | {"evaluation_identity"}
            result = {"fresh": False, "failed_checks": [n for n in rules.FRESHNESS_CHECKS if n in failed]}
        return result

    def _hard(self, c: CandidateModel) -> tuple[JSON, bool, bool]:
        artifact_ok = self.intact(c.artifact) and c.fields["sha_ok"]
        rollback_ok = self.active_baseline is not None and self.intact(self.active_baseline)
        return self._freshness(c), artifact_ok, rollback_ok

    def _passes(self, c: CandidateModel) -> bool:
        freshness, artifact_ok, rollback_ok = self._hard(c)
        return bool(freshness["fresh"]) and artifact_ok and rollback_ok

    def would_pass(self, artifact: str) -> bool:
        """Whether a candidate received from `artifact` now would pass its check."""
        return self._passes(CandidateModel(artifact, self.specs[artifact]["kind"], fields=self.specs[artifact]))

    def _available(self, c: CandidateModel) -> dict[str, bool]:
        out = {}
        for kind in KINDS:
            recorded = c.trusted.get(kind)
            out[kind] = recorded is not None and self.content.get(recorded[0], 0) == recorded[1]
        # An activated baseline is available without being recorded only when none was recorded: a recorded
        # verified_baseline that no longer re-hashes is not replaced by it. The rollback target is the baseline
        # the candidate branched from while it was activated and is intact, else the active one.
        if "verified_baseline" not in c.trusted and self.active_baseline is not None:
            own = c.fields["source"]
            out["verified_baseline"] = (own in self.activated and self.intact(own)) or self.intact(self.active_baseline)
        return out

    def predict(self, op: str, args: JSON) -> Prediction:
        """What `op` (a scenario step name) with `args` must do now."""
        return getattr(self, f"_{op}")(args)  # type: ignore[no-any-return]

    def _move(
        self, cid: str, state: str, events: int = 1, plan: JSON | None = None, then: Callable[[], Any] = lambda: None
    ) -> Prediction:
        c = self.candidates[cid]

        def commit() -> None:
            c.path += [c.state] * (events - 1) + [state]  # a failed stage: kept, then planned
            if plan is not None:
                c.plan = plan
            self.events += events
            then()

        return Prediction(events=events, states={cid: (state, c.version + events)}, plan=plan, apply=commit)

    def _create(self, cid: str, candidate: CandidateModel) -> Prediction:
        def create() -> None:
            self.candidates[cid] = candidate
            self.events += 1

        return Prediction(events=1, states={cid: ("received", 1)}, apply=create)

    def _existing(self, cid: str, allowed: tuple[str, ...]) -> Prediction | None:
        if cid not in self.candidates:
            return Prediction(errors=("NotFoundError",))
        if self.candidates[cid].state not in allowed:
            return Prediction(errors=("IllegalCommandError",))
        return None

    def _receive(self, args: JSON) -> Prediction:
        artifact = args["artifact"]
        cid = args.get("id") or artifact  # the default id is the manifest's policy_version: the artifact's name
        fields = dict(self.specs[artifact])
        c = self.candidates.get(cid)
        if c is not None and c.pending:
            return self._complete(cid, artifact, fields)
        if c is None:
            return self._create(cid, CandidateModel(artifact, fields["kind"], fields=fields))
        if c.fields == fields and c.artifact == artifact:
            return Prediction(states={cid: (c.state, c.version)})  # a retry: nothing new
        if c.state != "tune":
            return Prediction(errors=("IllegalCommandError",))

        def revise() -> None:  # a new life: its trusted states stay, its last plan does not
            c.fields, c.artifact, c.kind, c.plan = fields, artifact, fields["kind"], None

        return self._move(cid, "received", then=revise)

    def _register(self, args: JSON) -> Prediction:
        cid, kind, source = args["candidate"], args["kind"], self.active_baseline
        if kind not in rules.CANDIDATE_KINDS or source is None:  # its source: the active baseline
            return Prediction(errors=("InputError",))
        if cid not in self.candidates:
            return self._create(cid, CandidateModel("", kind, {"kind": kind, "source": source}, pending=True))
        c = self.candidates[cid]
        if c.pending and c.fields == {"kind": kind, "source": source}:
            return Prediction(states={cid: (c.state, c.version)})  # the same registration
        return Prediction(errors=("ConflictError",))

    def _complete(self, cid: str, artifact: str, fields: JSON) -> Prediction:
        """The finished adapter's manifest completes a registered candidate of its kind and source."""
        c = self.candidates[cid]
        if c.state != "received":
            return Prediction(errors=("IllegalCommandError",))
        if (fields["kind"], fields["source"]) != (c.fields["kind"], c.fields["source"]):
            return Prediction(errors=("InputError",))

        def complete() -> None:
            c.fields, c.artifact, c.pending, c.plan = fields, artifact, False, None  # as a revision: no last plan

        return self._move(cid, "received", then=complete)

    def _check(self, args: JSON) -> Prediction:
        cid = args["candidate"]
        if (refused := self._existing(cid, ("received", *DECIDED))) is not None:
            return refused
        if self.candidates[cid].pending:  # judged only once its adapter was received
            return Prediction(errors=("IllegalCommandError",))
        if self.active_baseline is None:  # nothing to check lineage against
            return Prediction(errors=("ConflictError",))
        c = self.candidates[cid]
        return self._move(cid, ("verified" if c.state == "received" else c.state) if self._passes(c) else "reject")

    def _hand_off(self, args: JSON) -> Prediction:
        cid = args["candidate"]
        if (refused := self._existing(cid, ("verified",))) is not None:
            return refused
        if self.active_baseline is None:
            return Prediction(errors=("ConflictError",))
        c = self.candidates[cid]
        freshness, artifact_ok, rollback_ok = self._hard(c)
        evidence = {"rollback_ready": rollback_ok, "artifact_verified": artifact_ok}
        status = rules.decide_lifecycle_handoff(c.fields["decision"], freshness, evidence)["handoff_status"]
        return self._move(cid, {"ready_for_evaluation": "ready", "tune": "tune", "reject": "reject"}[status])

    def _fail_stage(self, args: JSON) -> Prediction:
        cid, stage = args["candidate"], args["stage"]
        if stage not in rules.RECOVERY_STATES_BY_STAGE:
            return Prediction(errors=("InputError",) if cid in self.candidates else ("InputError", "NotFoundError"))
        if (refused := self._existing(cid, ("received", "verified", "recovering", "ready"))) is not None:
            return refused
        if self.candidates[cid].state == "ready" and stage != "artifact_validation":  # after hand-off: an export
            return Prediction(errors=("IllegalCommandError",))
        plan = rules.choose_recovery_action({"stage": stage, "available": self._available(self.candidates[cid])})
        blocked = plan["action"] in rules.BLOCKING_ACTIONS
        return self._move(cid, "reject" if blocked else "recovering", events=2, plan=plan)

    def _complete_recovery(self, args: JSON) -> Prediction:
        cid = args["candidate"]
        return self._existing(cid, ("recovering",)) or self._move(cid, "received")

    def _trusted(self, cid: str, kind: str) -> Prediction | None:
        """Refused for an unknown kind, else unless the candidate is alive (before the ledger reads a folder)."""
        return Prediction(errors=("InputError", "NotFoundError")) if kind not in KINDS else self._existing(cid, ALIVE)

    def _record_trusted_state(self, args: JSON) -> Prediction:
        cid, kind, folder = args["candidate"], args["kind"], args["artifact"]
        if (refused := self._trusted(cid, kind)) is not None:
            return refused
        if self.content.get(folder, 0) is None:
            return Prediction(errors=("InputError", "ArtifactError"))
        if kind == "verified_baseline" and not (folder in self.activated and self.intact(folder)):
            return Prediction(errors=("InputError",))  # only an activated baseline's own bytes
        c, content = self.candidates[cid], self.content.get(folder, 0) or 0
        return self._move(cid, c.state, then=lambda: c.trusted.__setitem__(kind, (folder, content)))

    def _invalidate_trusted_state(self, args: JSON) -> Prediction:
        cid, kind = args["candidate"], args["kind"]
        if (refused := self._trusted(cid, kind)) is not None:
            return refused
        c = self.candidates[cid]
        if kind not in c.trusted:
            return Prediction(errors=("ConflictError",))
        return self._move(cid, c.state, then=lambda: c.trusted.pop(kind))

    def _settings_change(self, change: Any, online_only: bool) -> Prediction:
        hit = [
            cid
            for cid, c in self.candidates.items()
            if c.state in DECIDED and (not online_only or c.kind in rules.ONLINE_KINDS)
        ]
        states = {cid: ("received", self.candidates[cid].version + 1) for cid in hit}

        def commit() -> None:
            change()
            for cid in hit:
                self.candidates[cid].path.append("received")
            self.events += 1 + len(hit)

        return Prediction(events=1 + len(hit), states=states, apply=commit)

    def _activate_baseline(self, args: JSON) -> Prediction:
        name = args["artifact"]
        if name == self.active_baseline:
            return Prediction()

        def activate() -> None:
            self.active_baseline = name
            self.activated.add(name)

        return self._settings_change(activate, online_only=False)

    def _advance_window(self, args: JSON) -> Prediction:
        window = args["window"]
        if window < self.active_window:
            return Prediction(errors=("ConflictError",))
        if window == self.active_window:
            return Prediction()
        return self._settings_change(lambda: setattr(self, "active_window", window), online_only=True)

    def _activate_evaluation(self, args: JSON) -> Prediction:
        version = args["version"]
        if version == self.evaluation:
            return Prediction()
        return self._settings_change(lambda: setattr(self, "evaluation", version), online_only=False)
