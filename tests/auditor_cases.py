"""Ledgers with every kind of rejection, built for real, shared by the auditor's tests.

Each case rejects one candidate for one cause on a real ledger file with real adapter
folders, and returns its id. `auditor_ledger` builds one ledger holding most of them,
plus a ready candidate and a recovering one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import DROP, Workspace

from lifecycle_fsm.ledger import Ledger

Case = Callable[[Workspace, Ledger], str]  # builds the rejection, returns the candidate id


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))


def lineage(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-old", source_policy_version="sha-of-an-older-baseline"))
    led.check("dpo-old")
    return "dpo-old"


def dpo_without_preference_evidence(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-noev", source_evidence=DROP))
    led.check("dpo-noev")
    return "dpo-noev"


def grpo_without_verifier(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.grpo("grpo-nover", trajectory_identity=DROP))
    led.check("grpo-nover")
    return "grpo-nover"


def grpo_stale_window(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.grpo("grpo-stale", evidence_window_index=1))
    led.advance_window(4)
    led.check("grpo-stale")
    return "grpo-stale"


def grpo_without_window_index(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.grpo("grpo-noidx", evidence_window_index=DROP))
    led.check("grpo-noidx")
    return "grpo-noidx"


def artifact_files(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-tamper"))
    folder = ws.root / "dpo-tamper" / "adapter"
    _flip(folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").unlink()
    (folder / "extra.bin").write_bytes(b"planted")
    led.check("dpo-tamper")
    return "dpo-tamper"


def rollback(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-rb"))
    _flip(ws.root / "sft" / "adapter" / "adapter_model.safetensors")
    led.check("dpo-rb")
    return "dpo-rb"


def upstream_reject(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-up", decision="reject"))
    led.check("dpo-up")
    led.hand_off("dpo-up")
    return "dpo-up"


def upstream_state(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.dpo("dpo-maybe", decision="maybe"))
    led.check("dpo-maybe")
    led.hand_off("dpo-maybe")
    return "dpo-maybe"


def blocking_recovery(ws: Workspace, led: Ledger) -> str:
    led.receive(ws.grpo("grpo-block"))
    ckpt = ws.root / "runs" / "pre_update"
    ckpt.mkdir(parents=True)
    (ckpt / "optimizer.pt").write_bytes(b"state")
    led.record_trusted_state("grpo-block", "pre_update_checkpoint", ckpt)
    led.invalidate_trusted_state("grpo-block", "pre_update_checkpoint", "optimizer state lost")
    _flip(ws.root / "sft" / "adapter" / "adapter_model.safetensors")
    led.fail_stage("grpo-block", "update")
    return "grpo-block"


# case -> (reason codes, the check row that proves it: name, claimed, checked against), filled per ledger
CASES: dict[str, tuple[Case, list[str], str]] = {
    "lineage": (lineage, ["source_policy"], "source_policy"),
    "dpo-no-preference-evidence": (dpo_without_preference_evidence, ["branch_evidence"], "branch_evidence"),
    "grpo-no-verifier": (grpo_without_verifier, ["branch_evidence"], "branch_evidence"),
    "grpo-stale-window": (grpo_stale_window, ["branch_evidence"], "branch_evidence"),
    "grpo-no-window-index": (grpo_without_window_index, ["branch_evidence"], "branch_evidence"),
    "artifact": (artifact_files, ["artifact"], "artifact"),
    "rollback": (rollback, ["rollback"], "rollback"),
    "upstream-reject": (upstream_reject, ["upstream_reject"], "upstream"),
    "upstream-state": (upstream_state, ["upstream_state"], "upstream"),
    "blocking-recovery": (blocking_recovery, ["block_update"], ""),
}


def auditor_ledger(ws: Workspace, *, actor: str = "auditor-test") -> dict[str, str]:
    """One ledger: lineage, artifact, upstream and blocking-recovery rejections, one ready, one recovering.

    Returns each candidate's id -> the state it must be in.
    """
    states = {}
    with ws.ledger(actor=actor) as led:
        led.init()
        led.activate_baseline(ws.baseline())
        for name in ("lineage", "artifact", "upstream-reject", "upstream-state", "grpo-stale-window"):
            states[CASES[name][0](ws, led)] = "reject"
        led.receive(ws.dpo("dpo-good"))
        led.check("dpo-good")
        led.hand_off("dpo-good")
        states["dpo-good"] = "ready"
        queue = ws.root / "runs" / "queue.jsonl"
        queue.parent.mkdir(parents=True, exist_ok=True)
        queue.write_text("{}\n")
        led.receive(ws.rlvr("rlvr-rec", evidence_window_index=4))
        led.record_trusted_state("rlvr-rec", "prompt_queue", queue)
        led.fail_stage("rlvr-rec", "sampling")
        states["rlvr-rec"] = "recovering"
        states[blocking_recovery(ws, led)] = "reject"  # last: it tampers with the baseline
    return states
