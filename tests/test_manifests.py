"""Tests for reading SFT and candidate manifests from real files (SPEC §6, §7)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.rules import KIND_BY_SEMANTIC_ID
from lifecycle_fsm.store.chain import canonical_json

SHA = "ab" * 32
ADAPTER = {"path": "adapter", "sha256": SHA}
LOADERS = [load_candidate_manifest, load_baseline_manifest]
LOADER_IDS = ["candidate", "baseline"]


def write_json(path: Path, data: Any) -> Path:
    """Write `data` as JSON at `path`, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def candidate(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    """Load a candidate manifest holding an adapter and `fields`; return the parsed fields."""
    path = write_json(tmp_path / "cand" / "manifest.json", {"artifacts": {"adapter": ADAPTER}, **fields})
    return load_candidate_manifest(path).fields


# --- structural problems are input errors naming the file ----------------------------


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
def test_missing_file(tmp_path: Path, load: Any) -> None:
    """A manifest that does not exist is an InputError naming the path."""
    path = tmp_path / "nowhere" / "manifest.json"
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load(path)
    assert "no such manifest" in str(info.value)


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
def test_directory_instead_of_file(tmp_path: Path, load: Any) -> None:
    """A folder given as a manifest is an InputError naming it."""
    with pytest.raises(InputError, match=re.escape(str(tmp_path))):
        load(tmp_path)


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize("text", ["{not json", "", '{"artifacts": ', "\x00\x01"])
def test_bad_json(tmp_path: Path, load: Any, text: str) -> None:
    """A file that is not valid JSON is an InputError naming the file."""
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load(path)
    assert "not valid JSON" in str(info.value)


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"policy_version": "a", "policy_version": "b", "artifacts": {}}', "key 'policy_version': given twice"),
        ('{"artifacts": {"adapter": {"path": "x", "path": "y"}}}', "key 'path': given twice"),
        ('{"artifacts": {}, "score": NaN}', "unexpected character"),
        ('{"artifacts": {}, "score": -Infinity}', "no digit after sign"),
        ('{"artifacts": {}, "score": 1e999}', "number is infinity"),
        ('{"artifacts": {"adapter": {"path": "a\\ud800b"}}}', "no low surrogate"),  # not a path any file has
        ("\ufeff{}", "byte order mark"),
        ('{"a": ' * 50_000 + "1" + "}" * 50_000, "depth limit exceeded"),
    ],
)
def test_json_that_says_two_things_or_no_number_is_refused(tmp_path: Path, load: Any, text: str, why: str) -> None:
    """A key given twice would be read as its last value, NaN as a number, a lone surrogate as a path no
    file system can open: the manifest is refused when it is read, before anything is appended."""
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(why)) as info:
        load(path)
    assert str(info.value).startswith(f"manifest {path} is not valid JSON: ")


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
def test_an_artifact_path_holding_a_nul_is_refused(tmp_path: Path, load: Any) -> None:
    """No file system path holds a NUL: refused when the manifest is read, before anything is hashed."""
    path = write_json(tmp_path / "manifest.json", {"artifacts": {"adapter": {"path": "adapter\x00x", "sha256": SHA}}})
    with pytest.raises(InputError, match=r"artifacts\.adapter\.path .* holds a NUL character"):
        load(path)


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize(
    ("data", "type_name"), [([{"artifacts": {}}], "an array"), ("text", "a string"), (3, "a number"), (None, "null")]
)
def test_not_an_object(tmp_path: Path, load: Any, data: Any, type_name: str) -> None:
    """A JSON value that is not an object is an InputError naming the file and what was found."""
    path = write_json(tmp_path / "manifest.json", data)
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load(path)
    assert f"must be a JSON object, not {type_name}" in str(info.value)


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize(
    "data",
    [
        {},
        {"artifacts": {}},
        {"artifacts": None},
        {"artifacts": ["adapter"]},
        {"artifacts": {"adapter": None}},
        {"artifacts": {"adapter": "adapter"}},
        {"artifacts": {"weights": ADAPTER}},
    ],
    ids=["no-artifacts", "empty-artifacts", "null-artifacts", "list-artifacts", "null-adapter", "str-adapter", "other"],
)
def test_no_adapter(tmp_path: Path, load: Any, data: dict[str, Any]) -> None:
    """A manifest without an `artifacts.adapter` object is an InputError naming the file and the key."""
    path = write_json(tmp_path / "manifest.json", data)
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load(path)
    assert str(info.value).endswith("lacks artifacts.adapter")


@pytest.mark.parametrize("load", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize("adapter", [{"sha256": SHA}, {"path": "", "sha256": SHA}, {"path": None}, {"path": 7}])
def test_adapter_without_path(tmp_path: Path, load: Any, adapter: dict[str, Any]) -> None:
    """An adapter without a non-empty string path is an InputError naming the file and the key."""
    path = write_json(tmp_path / "manifest.json", {"artifacts": {"adapter": adapter}})
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load(path)
    assert "lacks artifacts.adapter.path" in str(info.value)


@pytest.mark.parametrize("sha", ["<missing>", "", None, 42])
def test_baseline_without_sha256(tmp_path: Path, sha: Any) -> None:
    """An SFT manifest without an adapter sha256 has no policy version: InputError naming the file."""
    adapter: dict[str, Any] = {"path": "adapter"} if sha == "<missing>" else {"path": "adapter", "sha256": sha}
    path = write_json(tmp_path / "sft" / "manifest.json", {"artifacts": {"adapter": adapter}})
    with pytest.raises(InputError, match=re.escape(str(path))) as info:
        load_baseline_manifest(path)
    assert "artifacts.adapter.sha256" in str(info.value)


def test_input_error_is_a_value_error() -> None:
    """Callers who only know the standard library can catch a manifest error as ValueError."""
    assert issubclass(InputError, ValueError)


# --- the baseline -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"semantic_id": "PT-DPO-OFFLINE"}, "a dpo candidate's manifest (PT-DPO-OFFLINE), not an SFT delivery"),
        ({"semantic_id": "PT-GRPO-GROUPWISE"}, "a grpo candidate's manifest"),
        ({"semantic_id": "PT-SFT-DELIVERY", "decision": "reject"}, "a rejected delivery is no baseline"),
    ],
)
def test_a_candidate_or_rejected_manifest_is_no_baseline(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    """Activating a candidate's manifest, or an SFT delivery rejected upstream, as the baseline is refused."""
    path = write_json(tmp_path / "sft" / "manifest.json", {**fields, "artifacts": {"adapter": ADAPTER}})
    with pytest.raises(InputError, match=re.escape(message)):
        load_baseline_manifest(path)
    for odd in (["PT-DPO-OFFLINE"], {"x": 1}, None):  # not a name: neither a candidate's nor a traceback
        assert load_baseline_manifest(write_json(path, {"semantic_id": odd, "artifacts": {"adapter": ADAPTER}}))


def test_baseline_fields(tmp_path: Path) -> None:
    """The baseline keeps the manifest's absolute path and file sha256, and its adapter path and hash."""
    path = write_json(
        tmp_path / "sft" / "manifest.json", {"semantic_id": "PT-SFT-DELIVERY", "artifacts": {"adapter": ADAPTER}}
    )
    base = load_baseline_manifest(path)
    assert base.path == str(path)
    assert base.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert base.adapter_sha256 == SHA
    assert base.adapter_path_as_written == "adapter"
    assert base.adapter_path == str(tmp_path / "sft" / "adapter")


# --- candidate fields ------------------------------------------------------------------------


@pytest.mark.parametrize(("semantic_id", "kind"), sorted(KIND_BY_SEMANTIC_ID.items()))
def test_semantic_id_gives_kind(tmp_path: Path, semantic_id: str, kind: str) -> None:
    """The seed's semantic ids map to their candidate kinds."""
    assert candidate(tmp_path, semantic_id=semantic_id)["candidate_kind"] == kind


def test_semantic_id_table() -> None:
    """The mapping is exactly SPEC §7's: DPO offline and GRPO groupwise."""
    assert KIND_BY_SEMANTIC_ID == {"PT-DPO-OFFLINE": "dpo", "PT-GRPO-GROUPWISE": "grpo"}


@pytest.mark.parametrize(
    ("semantic_id", "explicit"), [("PT-GRPO-GROUPWISE", "rlvr"), ("PT-DPO-OFFLINE", "grpo"), (None, "dpo")]
)
def test_explicit_candidate_kind_wins(tmp_path: Path, semantic_id: str | None, explicit: str) -> None:
    """An explicit candidate_kind overrides what the semantic id implies."""
    fields = candidate(tmp_path, semantic_id=semantic_id, candidate_kind=explicit)
    assert fields["candidate_kind"] == explicit
    assert fields["semantic_id"] == semantic_id


@pytest.mark.parametrize("semantic_id", ["PT-PPO-ONLINE", "", None, 5])
def test_unknown_semantic_id_is_carried_not_refused(tmp_path: Path, semantic_id: Any) -> None:
    """An unknown semantic id is not an input error: the kind is None and the check will reject it."""
    fields = candidate(tmp_path, semantic_id=semantic_id)
    assert fields["candidate_kind"] is None
    assert fields["semantic_id"] == semantic_id


def test_identity_fields_are_read(tmp_path: Path) -> None:
    """Lineage, identity, decision and adapter fields come straight from the manifest."""
    fields = candidate(
        tmp_path,
        semantic_id="PT-DPO-OFFLINE",
        source_policy_version="sft-sha",
        policy_version="dpo-v5",
        evaluation_version="eval-v1",
        decision="tune",
    )
    assert fields["source_policy_version"] == "sft-sha"
    assert fields["policy_version"] == "dpo-v5"
    assert fields["evaluation_version"] == "eval-v1"
    assert fields["decision"] == "tune"
    assert fields["adapter_path"] == "adapter"
    assert fields["adapter_sha256"] == SHA


def test_semantic_gaps_are_kept_as_none(tmp_path: Path) -> None:
    """A manifest with only an adapter loads; every missing identity is None for the checks to judge."""
    fields = candidate(tmp_path)
    for key in (
        "candidate_kind",
        "semantic_id",
        "source_policy_version",
        "policy_version",
        "evaluation_version",
        "preference_evidence_version",
        "verifier_version",
        "evidence_window_index",
        "decision",
    ):
        assert fields[key] is None, key


def test_verifier_version_from_trajectory_identity(tmp_path: Path) -> None:
    """GRPO/RLVR verifier version is read from trajectory_identity.verifier_version."""
    fields = candidate(tmp_path, semantic_id="PT-GRPO-GROUPWISE", trajectory_identity={"verifier_version": "math-v1"})
    assert fields["verifier_version"] == "math-v1"


def test_verifier_version_absent(tmp_path: Path) -> None:
    """A trajectory identity without a verifier (or not an object) gives None."""
    assert candidate(tmp_path, trajectory_identity={"sampler": "x"})["verifier_version"] is None
    assert candidate(tmp_path, trajectory_identity="math-v1")["verifier_version"] is None


@pytest.mark.parametrize("index", [1, 0, -3, "1", 1.5, None, True, [1]])
def test_evidence_window_index_is_kept_raw(tmp_path: Path, index: Any) -> None:
    """The evidence window index is carried exactly as written, never coerced."""
    value = candidate(tmp_path, evidence_window_index=index)["evidence_window_index"]
    assert value == index and type(value) is type(index)


def test_missing_evidence_window_index_is_none(tmp_path: Path) -> None:
    """A missing evidence window index is None, not the seed's -1 default."""
    assert candidate(tmp_path, semantic_id="PT-GRPO-GROUPWISE")["evidence_window_index"] is None


# --- paths -----------------------------------------------------------------------------------


def test_relative_adapter_path_is_relative_to_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative adapter path resolves against the manifest's folder, not the working directory."""
    write_json(tmp_path / "runs" / "dpo" / "manifest.json", {"artifacts": {"adapter": {"path": "../shared/adapter"}}})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_candidate_manifest(tmp_path / "runs" / "dpo" / "manifest.json")
    assert loaded.fields["adapter_resolved_path"] == str(tmp_path / "runs" / "shared" / "adapter")
    assert loaded.fields["adapter_path"] == "../shared/adapter"


def test_relative_manifest_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest named relative to the working directory still resolves its adapter beside it."""
    write_json(tmp_path / "runs" / "manifest.json", {"artifacts": {"adapter": ADAPTER}})
    monkeypatch.chdir(tmp_path)
    loaded = load_candidate_manifest(Path("runs") / "manifest.json")
    assert loaded.path == str(tmp_path / "runs" / "manifest.json")
    assert loaded.fields["adapter_resolved_path"] == str(tmp_path / "runs" / "adapter")
    assert load_baseline_manifest("runs/manifest.json").adapter_path == str(tmp_path / "runs" / "adapter")


def test_absolute_adapter_path_is_kept(tmp_path: Path) -> None:
    """An absolute adapter path is used as written (normalised)."""
    target = tmp_path / "abs" / "adapter"
    fields = candidate(tmp_path, artifacts={"adapter": {"path": str(target) + os.sep, "sha256": SHA}})
    assert fields["adapter_resolved_path"] == str(target)


def test_candidate_manifest_identity(tmp_path: Path) -> None:
    """The candidate keeps its manifest's absolute path and the sha256 of its bytes."""
    path = write_json(tmp_path / "cand" / "manifest.json", {"artifacts": {"adapter": ADAPTER}})
    loaded = load_candidate_manifest(path)
    assert loaded.path == str(path)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


# --- DPO preference evidence ---------------------------------------------------------------------


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"source_evidence": {"version": "pref-train-v1"}}, "pref-train-v1"),
        ({"source_evidence": {"preference_evidence_version": "pv-2", "version": "v"}}, "pv-2"),
        ({"source_evidence": "pref-train-v3"}, "pref-train-v3"),
        ({"source_evidence": {"version": "ignored"}, "preference_evidence_version": "explicit"}, "explicit"),
        ({"source_evidence": {}}, None),
        ({"source_evidence": []}, None),
        ({"source_evidence": None}, None),
        ({}, None),
    ],
)
def test_preference_evidence_identity(tmp_path: Path, fields: dict[str, Any], expected: str | None) -> None:
    """DPO preference evidence identity: explicit field, else source_evidence's version or the string itself."""
    assert candidate(tmp_path, semantic_id="PT-DPO-OFFLINE", **fields)["preference_evidence_version"] == expected


def test_source_evidence_without_version_is_digested(tmp_path: Path) -> None:
    """A source_evidence object without a version is identified by the sha256 of its canonical JSON."""
    evidence = {"dataset": "prefs.jsonl", "sha256": SHA, "rows": 1024}
    value = candidate(tmp_path, semantic_id="PT-DPO-OFFLINE", source_evidence=evidence)["preference_evidence_version"]
    assert value == _digest(evidence)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", value)
    reordered = dict(reversed(list(evidence.items())))
    assert candidate(tmp_path, source_evidence=reordered)["preference_evidence_version"] == value
    changed = candidate(tmp_path, source_evidence={**evidence, "rows": 1025})["preference_evidence_version"]
    assert changed != value


def test_source_evidence_list_is_digested(tmp_path: Path) -> None:
    """A non-empty list of evidence files is identified by the digest of its canonical JSON."""
    evidence = [{"path": "a.jsonl", "sha256": SHA}]
    assert candidate(tmp_path, source_evidence=evidence)["preference_evidence_version"] == _digest(evidence)
