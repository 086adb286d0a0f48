"""What `LedgerCallback.finish` writes in a candidate's manifest by default, and what it refuses before it
saves anything: fields it fills itself, a candidate that can take no adapter, and an output folder that holds
another candidate's (saving there would overwrite bytes a hand-off trusted)."""

from __future__ import annotations

import os

from lifecycle_fsm.errors import IllegalCommandError, InputError
from lifecycle_fsm.integrations.recovery import existing
from lifecycle_fsm.json_types import JSON, strict_loads
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.machine import State

__all__ = ["adapter_received", "manifest_defaults", "may_finish", "refuse_filled"]

# Manifest fields `finish` fills from the run and the adapter it saves, never from a caller.
_FILLED = frozenset({"candidate_id", "kind", "adapter_path", "adapter_sha256"})


def manifest_defaults(kind: str, card: JSON | None, registered: JSON, evaluation_version: str | None) -> JSON:
    """The manifest fields `finish` fills unless given: the baseline the candidate was registered against,
    the ledger's evaluation version, a DPO run's dataset fingerprint or an online run's window."""
    defaults: JSON = {
        "source_policy_version": registered["source_policy_version"],
        "evaluation_version": evaluation_version,
    }
    if kind == "dpo":
        fingerprint = (card or {}).get("dataset", {}).get("fingerprint")
        defaults["source_evidence_version"] = None if fingerprint is None else f"datasets:{fingerprint}"
    else:
        defaults["evidence_window_index"] = registered["active_window"]
    return defaults


def refuse_filled(fields: JSON) -> None:
    if filled := sorted(fields.keys() & _FILLED):
        raise InputError(f"finish() fills {', '.join(filled)} itself, from the run and the adapter it saves")


def adapter_received(ledger: Ledger, candidate_id: str, adapter: str, manifest_file: str, decision: str) -> bool:
    """Whether the candidate received its adapter already (a `finish` repeated, or resumed after a crash:
    nothing is saved over the bytes the ledger holds); refused before anything is saved: a candidate
    that can take none (rejected), a folder holding another candidate's adapter, and a repeated
    `finish` asking for another decision than the one its adapter was received with."""
    current = existing(ledger, candidate_id)
    if current is not None and current.state is State.REJECT:
        raise IllegalCommandError(
            f"candidate {candidate_id!r} is reject ({', '.join(current.reason_codes) or 'no reason'}), "
            "which is final: its adapter is not saved",
            state=current.state.value,
            trigger="receive",
        )
    manifest = os.path.join(os.path.dirname(adapter), manifest_file)
    if os.path.lexists(manifest):
        try:
            with open(manifest, "rb") as f:
                owner = strict_loads(f.read()).get("policy_version")
        except (OSError, ValueError, AttributeError):
            owner = None
        if owner != candidate_id:
            raise InputError(
                f"{os.path.dirname(adapter)} holds the adapter and manifest of {owner or 'another candidate'!r}, "
                f"not {candidate_id!r}: train each candidate in an output_dir of its own"
            )
    received = current is not None and not current.pending and current.manifest_path is not None
    if received:
        _refuse_other_decision(ledger, candidate_id, decision)
    return received


def _refuse_other_decision(ledger: Ledger, candidate_id: str, decision: str) -> None:
    """A repeated `finish` must ask for the decision its candidate received its adapter with: another one
    would be answered with the first (the keys are recorded), the caller's decision silently lost."""
    recorded = ledger.candidate(candidate_id).candidate.get("decision")
    if recorded != decision:
        raise InputError(
            f"candidate {candidate_id!r} received its adapter with decision {recorded!r}: finish(decision="
            f"{decision!r}) cannot change it (a new decision needs a new candidate)"
        )


def may_finish(
    ledger: Ledger,
    candidate_id: str,
    registered: JSON | None,
    adapter: str,
    manifest_file: str,
    decision: str,
    fields: JSON,
) -> bool:
    """`adapter_received`, after what `finish` refuses before it saves anything: a run that never trained
    (the candidate is registered at train begin), and no evaluation version for the manifest it would write."""
    received = adapter_received(ledger, candidate_id, adapter, manifest_file, decision)
    if registered is None:
        raise InputError("finish() before training: cb.train(trainer) registers the candidate first")
    chosen = fields["evaluation_version"] if "evaluation_version" in fields else ledger.settings().evaluation_version
    if not received and not chosen:
        raise InputError("finish() needs evaluation_version: the ledger has no active evaluation version")
    return received
