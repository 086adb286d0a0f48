"""One rule for a manifest's relative artifact path: under the artifact root when one is given,
else beside the manifest file; the same for `receive`, `baseline activate`, `check` and the audit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import Workspace, cli, run_cli

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest, resolve_artifact_path


def test_the_rule(tmp_path: Path) -> None:
    manifest = str(tmp_path / "results" / "m.json")
    assert resolve_artifact_path("out/adapter", manifest, tmp_path / "project") == str(
        tmp_path / "project" / "out" / "adapter"
    )
    assert resolve_artifact_path("adapter", manifest, None) == str(tmp_path / "results" / "adapter")
    assert resolve_artifact_path("../x/./adapter", manifest, None) == str(tmp_path / "x" / "adapter")
    assert resolve_artifact_path("/abs/adapter", manifest, tmp_path) == "/abs/adapter"


def test_manifests_read_under_a_root_resolve_from_it(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, paths_from_root=True)
    sft, dpo = ws.baseline(), ws.dpo()
    assert load_baseline_manifest(sft, tmp_path).adapter_path == str(tmp_path / "sft" / "adapter")
    candidate = load_candidate_manifest(dpo, tmp_path)
    assert candidate.fields["adapter_resolved_path"] == str(tmp_path / "dpo-v5" / "adapter")
    assert candidate.adapter == json.loads(dpo.read_text())["artifacts"]["adapter"]
    beside = load_candidate_manifest(dpo).fields["adapter_resolved_path"]  # no root: beside the manifest
    assert beside == str(tmp_path / "dpo-v5" / "dpo-v5" / "adapter")


def test_the_api_verifies_manifests_written_against_the_project_root(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, paths_from_root=True)
    sft, dpo = ws.baseline(), ws.dpo()
    with Ledger.open(ws.db, synchronous="NORMAL", artifact_root=tmp_path) as ledger:
        ledger.init()
        ledger.activate_baseline(sft)
        ledger.receive(dpo)
        assert ledger.check("dpo-v5").state == "verified"
        assert ledger.hand_off("dpo-v5").state == "ready"


@pytest.mark.slow
def test_cli_check_reads_relative_paths_under_the_artifact_root_flag_and_env(tmp_path: Path) -> None:
    """Manifests written the workflow's way (paths from the project root) verify through `check`
    given the root by `--artifact-root` or by `LIFECYCLE_ARTIFACT_ROOT` (a relative root, from the
    working folder); without a root the same paths are read beside each manifest and rejected."""
    project = tmp_path / "project"
    ws = Workspace(project, paths_from_root=True)
    project.mkdir()
    sft, dpo = ws.baseline(), ws.dpo()
    flag = ["--artifact-root", str(project)]
    env = {"LIFECYCLE_ARTIFACT_ROOT": "project"}
    runs = {"flag": (flag, {}), "env": ([], env), "none": ([], {})}
    states = {}
    for name, (args, extra) in runs.items():
        db = tmp_path / f"{name}.db"
        environment = {k: v for k, v in os.environ.items() if k != "LIFECYCLE_ARTIFACT_ROOT"} | extra
        for argv in (["init"], ["baseline", "activate", str(sft)], ["receive", str(dpo)]):
            done = run_cli(db, *args, *argv, env=environment, cwd=tmp_path)
            assert done.returncode == 0, (name, argv, done.stderr)
        done = run_cli(db, *args, "--json", "check", "dpo-v5", env=environment, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        states[name] = (json.loads(done.stdout)["state"], json.loads(done.stdout)["reason_codes"])
    assert states == {
        "flag": ("verified", []),
        "env": ("verified", []),
        "none": ("reject", ["rollback", "artifact"]),
    }


def test_a_root_that_is_not_there_decides_nothing(tmp_path: Path) -> None:
    """A root that does not exist (an unmounted volume, a typo, a stale LIFECYCLE_ARTIFACT_ROOT) is the
    environment's fault: the check is inconclusive and a ready candidate stays ready, never rejected
    for paths that "escape" it; a root that is there and leaves the baseline outside still rejects."""
    ws = Workspace(tmp_path)
    with Ledger.open(ws.db) as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.check("dpo-v5")
        ledger.hand_off("dpo-v5")
    with Ledger.open(ws.db, artifact_root=tmp_path / "unmounted") as ledger:
        result = ledger.check("dpo-v5")
        assert (result.state, result.candidate.reason_codes) == ("ready", ())
        assert result.inconclusive
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Ledger.open(ws.db, artifact_root=elsewhere) as ledger:
        rejected = ledger.check("dpo-v5").candidate
        assert (rejected.state, rejected.reason_codes) == ("reject", ("rollback", "artifact", "path_escapes_root"))
    explained = cli(ws.db, "explain", "dpo-v5")  # nothing was read: no hash, written as the auditor reads null
    assert "actual (re-hashed): none" in explained.stdout and "None" not in explained.stdout
