"""Build a small, realistic fixture tree for `lifecycle audit` (the real-artifact audit), or README's tour.

Usage: python examples/make_fixtures.py [FOLDER] [--size-mb N]   (FOLDER defaults to ./demo)
       python examples/make_fixtures.py --tour [FOLDER] [--size-mb N]   (FOLDER new or empty; ./tour)

It writes three LoRA adapters (adapter_config.json + adapter_model.safetensors of a
few MB, deterministic bytes from a seeded RNG) and their manifests in the source
workflow's shapes (built by `lifecycle_fsm.replay.drills.workspace`, the factory the tests and drills use too):
the SFT baseline (62), a DPO candidate (84) and a GRPO/RLVR candidate (85). Every
sha256 is computed by `lifecycle hash --json`, run as a subprocess, exactly as a
training job would record it. Running it twice gives the same bytes. It ends by
printing the audit command to run next.

With `--tour` it writes instead exactly the files README's "A tour" names:
`sft/manifest.json`, `dpo/manifest.json` (id `dpo-v5`) and `grpo/manifest.json` (id
`grpo-v7`), each beside its `adapter/`, and `runs/grpo/trajectories.jsonl`; the tour's
commands then run in that folder (tests/test_readme_tour.py runs them all).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from lifecycle_fsm.replay.drills.workspace import baseline_manifest, candidate_manifest

SFT_LABEL = "sft_delivery_v2_1"
DPO_LABEL = "dpo_offline_len1024_v5"
GRPO_LABEL = "grpo_rlvr_len384_v7"
RUN_LABEL = "post_training_lifecycle_v6"
BASE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
HIDDEN = 896  # the base model's hidden size
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def safetensors_bytes(seed: str, rank: int, layers: int) -> bytes:
    """A valid safetensors file of LoRA A/B matrices (BF16), filled from a seeded RNG."""
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for layer in range(layers):
        for module in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            for name, shape in (("lora_A", [rank, HIDDEN]), ("lora_B", [HIDDEN, rank])):
                size = shape[0] * shape[1] * 2
                header[f"{prefix}.{name}.weight"] = {
                    "dtype": "BF16",
                    "shape": shape,
                    "data_offsets": [offset, offset + size],
                }
                offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + rng.randbytes(offset)


def write_adapter(folder: Path, seed: str, size_mb: float) -> Path:
    """An adapter folder as PEFT saves it; its weights are about `size_mb` MB."""
    rank = 16
    per_layer = len(TARGETS) * 2 * rank * HIDDEN * 2
    layers = max(1, round(size_mb * 1024 * 1024 / per_layer))
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "base_model_name_or_path": BASE_MODEL,
        "bias": "none",
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.05,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(TARGETS),
        "task_type": "CAUSAL_LM",
    }
    write_json(folder / "adapter_config.json", config)
    (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes(seed, rank, layers))
    return folder


def lifecycle_hash(path: Path) -> str:
    """The sha256 `lifecycle hash --json PATH` reports (a real subprocess)."""
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "hash", "--json", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return str(json.loads(done.stdout)["sha256"])


def build(root: Path, size_mb: float = 3.0) -> dict[str, Path]:
    """Write the tree under `root`; return the manifest paths."""
    results = root / "benchmarks" / "results"
    outputs = root / "outputs"
    sft_adapter = write_adapter(outputs / SFT_LABEL / "adapter", f"sft:{SFT_LABEL}", size_mb)
    dpo_adapter = write_adapter(outputs / DPO_LABEL / "adapter", f"dpo:{DPO_LABEL}", size_mb)
    grpo_adapter = write_adapter(outputs / GRPO_LABEL / "adapter", f"grpo:{GRPO_LABEL}", size_mb)

    def adapter_entry(manifest: Path, adapter: Path) -> dict[str, str]:
        # Written relative to the project root, as the workflow's manifests are: `audit --root ROOT` reads them.
        return {"path": adapter.relative_to(root).as_posix(), "sha256": lifecycle_hash(adapter)}

    sft = results / "62_sft_delivery" / f"sft_delivery_manifest_{SFT_LABEL}.json"
    sft_entry = adapter_entry(sft, sft_adapter)
    sft_sha = sft_entry["sha256"]
    write_json(
        sft,
        baseline_manifest(
            sft_sha,
            adapter_path=sft_entry["path"],
            run_label=SFT_LABEL,
            base_model=BASE_MODEL,
            decision="accept",
        ),
    )
    dpo = results / "84_dpo_preference" / f"dpo_manifest_{DPO_LABEL}.json"
    dpo_entry = adapter_entry(dpo, dpo_adapter)
    write_json(
        dpo,
        candidate_manifest(
            "dpo",
            source_policy_version=sft_sha,
            policy_version=DPO_LABEL,
            adapter_sha256=dpo_entry["sha256"],
            adapter_path=dpo_entry["path"],
            evaluation_version="frozen-eval-v3",
            run_label=DPO_LABEL,
            source_evidence={"preference_dataset": "ultrafeedback-binarized-zh", "version": "pref-v5", "pairs": 12000},
            metrics={"preference_accuracy": 0.71, "reward_margin": 0.84},
        ),
    )
    grpo = results / "85_grpo_alignment" / f"grpo_manifest_{GRPO_LABEL}.json"
    grpo_entry = adapter_entry(grpo, grpo_adapter)
    write_json(
        grpo,
        candidate_manifest(
            "grpo",
            source_policy_version=sft_sha,
            policy_version=GRPO_LABEL,
            adapter_sha256=grpo_entry["sha256"],
            adapter_path=grpo_entry["path"],
            evaluation_version="frozen-eval-v3",
            run_label=GRPO_LABEL,
            trajectory_identity={"verifier_version": "math-verifier-v2", "prompt_set_version": "gsm8k-train-v1"},
            metrics={"pass_at_group": 0.62, "group_size": 8},
        ),
    )
    return {"baseline": sft, "dpo": dpo, "grpo": grpo}


TOUR_IDS = {"dpo": "dpo-v5", "grpo": "grpo-v7"}  # the candidate ids README's tour names
TOUR_TRAJECTORIES = Path("runs") / "grpo" / "trajectories.jsonl"


def build_tour(root: Path, size_mb: float = 3.0) -> dict[str, Path]:
    """Write the files README's tour names under `root`; return them (manifests and trajectories)."""
    sft_adapter = write_adapter(root / "sft" / "adapter", f"sft:{SFT_LABEL}", size_mb)
    sft_sha = lifecycle_hash(sft_adapter)
    made = {"baseline": root / "sft" / "manifest.json"}
    write_json(
        made["baseline"],
        baseline_manifest(
            sft_sha,
            adapter_path="adapter",
            run_label=SFT_LABEL,
            base_model=BASE_MODEL,
            decision="accept",
        ),
    )
    evidence: dict[str, dict[str, Any]] = {
        "dpo": {"source_evidence": {"preference_dataset": "ultrafeedback-binarized-zh", "version": "pref-v5"}},
        "grpo": {"trajectory_identity": {"verifier_version": "math-verifier-v2", "prompt_set_version": "gsm8k-v1"}},
    }
    for kind, cid in TOUR_IDS.items():
        adapter = write_adapter(root / kind / "adapter", f"{kind}:{cid}", size_mb)
        made[kind] = root / kind / "manifest.json"
        write_json(
            made[kind],
            candidate_manifest(
                kind,
                source_policy_version=sft_sha,
                policy_version=cid,
                adapter_sha256=lifecycle_hash(adapter),
                adapter_path="adapter",
                evaluation_version="frozen-eval-v3",
                run_label=cid,
                **evidence[kind],
            ),
        )
    made["trajectories"] = root / TOUR_TRAJECTORIES
    made["trajectories"].parent.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt_id": i, "completion": f"answer {i}", "reward": None} for i in range(8)]
    made["trajectories"].write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), encoding="utf-8")
    return made


def audit_command(root: Path, manifests: dict[str, Path]) -> str:
    """The command that audits this tree for real (the dry run is the same without --mode)."""
    args = [
        "lifecycle",
        "--db",
        str(root / "lifecycle.db"),
        "audit",
        "--baseline",
        str(manifests["baseline"]),
        "--candidates",
        str(manifests["dpo"]),
        str(manifests["grpo"]),
        "--label",
        RUN_LABEL,
        "--mode",
        "real_artifact",
        "--root",
        str(root),
        "--out",
        str(root / "benchmarks" / "results" / "86_post_training_lifecycle"),
    ]
    return shlex.join(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, help="where to build the tree (./demo; with --tour ./tour)")
    parser.add_argument("--size-mb", type=float, default=3.0, help="weights per adapter, in MB (3)")
    parser.add_argument("--tour", action="store_true", help="write the files README's tour names instead")
    args = parser.parse_args(argv)
    if args.tour:
        folder: Path = args.folder or Path("tour")
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            parser.error(f"{folder} is not an empty folder: the tour starts a fresh ledger there")
        for name, path in build_tour(folder, args.size_mb).items():
            print(f"{name}: {path}")
        print(f"\nnext, the tour (README): cd {shlex.quote(str(folder))} && lifecycle init ...")
        return 0
    args.folder = args.folder or Path("demo")
    manifests = build(args.folder, args.size_mb)
    for name, path in manifests.items():
        print(f"{name}: {path}")
    print("\nnext, audit it:")
    print(audit_command(args.folder, manifests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
