"""What a command reads before any work: its arguments, checked (bad input an `InputError`, a missing
baseline a `ConflictError`), and the manifests it names. A manifest's structural problem (no file, bad JSON,
no `artifacts.adapter.path`) is an input error; a semantic one (an unknown kind, an empty version) is
carried through, so the candidate's check rejects it with reason codes an auditor can read."""

from __future__ import annotations

import datetime as dt
import difflib
import getpass
import hashlib
import json
import os
import re
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.errors import ConflictError, InputError, StoreError
from lifecycle_fsm.events import text_or_error
from lifecycle_fsm.json_types import JSON, strict_loads
from lifecycle_fsm.limits import MAX_MANIFEST_BYTES, check_actor, read_regular_file
from lifecycle_fsm.outputs import write_atomic
from lifecycle_fsm.retry import RetryPolicy
from lifecycle_fsm.rules import CANDIDATE_KINDS, KIND_BY_SEMANTIC_ID, is_identity
from lifecycle_fsm.state import LedgerSettings
from lifecycle_fsm.store.chain import STORED_TIME, canonical_json
from lifecycle_fsm.streams import check_cache_size


def utc_now() -> str:
    """The clock events are stamped with (UTC, microseconds); never read on replay."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def path_argument(name: str, value: object) -> str:
    """A path the caller passed (a `str` or an `os.PathLike` of one) as a `str`; anything else, or a NUL in
    it, is an InputError naming the argument (not `os.fspath`'s TypeError or `os.stat`'s ValueError)."""
    if type(value) is not str:  # the common case: a plain str needs no ABC check
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise InputError(f"{name} must be a path (a str or os.PathLike), not {type(value).__name__} ({value!r})")
    if "\x00" in value:
        raise InputError(f"{name} {value!r} holds a NUL character, which no file system path can")
    return value


_STORED_TIME = re.compile(STORED_TIME)
_EXAMPLE_TIME = "2026-11-30T12:00:00.000000Z"


def recorded_time(reading: object) -> str:
    """A clock's reading as an event stores it: UTC text `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the one form in which
    `--as-of` can compare times as text."""
    try:
        if isinstance(reading, str) and _STORED_TIME.fullmatch(reading):
            dt.datetime.fromisoformat(reading[:-1])  # a real moment: no month 13, no 25:00
            return reading
    except ValueError:
        pass
    raise InputError(f"the ledger's clock gave {reading!r}: an event's time is UTC text like {_EXAMPLE_TIME}")


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def default_id(fields: JSON, manifest_path: str | os.PathLike[str]) -> str:
    """The manifest's policy_version; without a usable one, the manifest's path as given (the candidate is
    received under it and its check rejects it: a semantic problem, not an input error)."""
    version = fields.get("policy_version")
    if is_identity(version):
        return str(version)
    return Path(os.path.normpath(manifest_path)).as_posix()


def suggest(word: object, choices: Iterable[str], listed: Iterable[str] | None = None) -> str:
    """`, did you mean 'x'?` for the closest of `choices`, then the choices (or `listed`) themselves."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1) if isinstance(word, str) else []
    return (f", did you mean {close[0]!r}?" if close else "") + f" (expected one of {', '.join(listed or choices)})"


def require_choice(what: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise InputError(f"unknown {what} {value!r}{suggest(value, choices)}")


def require_baseline(settings: LedgerSettings) -> None:
    if settings.baseline is None:
        raise ConflictError("no active baseline: run `lifecycle baseline activate SFT_MANIFEST` first")


def checked_options(actor: object, artifact_root: object, retry: object, cached_candidates: object) -> str | None:
    """The constructor's argument checks (InputError); the artifact root made absolute."""
    if actor:  # an empty one means the default
        check_actor(text_or_error("actor", actor) if isinstance(actor, str) else actor)  # a NUL said as such
    if not isinstance(retry, RetryPolicy):  # else every command would fail on `retry.deadline`
        raise InputError(f"retry must be a RetryPolicy, not {type(retry).__name__} ({retry!r})")
    check_cache_size(cached_candidates)
    return None if artifact_root is None else os.path.abspath(path_argument("artifact_root", artifact_root))


def read_only_folder(target: str | os.PathLike[str]) -> StoreError | None:
    """Why an existing ledger file could not be opened to write, when its folder may not be written (SQLite
    keeps the `-wal` and `-shm` beside the file); None for anything else."""
    from lifecycle_fsm.store.open import is_postgres_url

    if is_postgres_url(target):
        return None
    path = os.fspath(target)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if not os.path.isfile(real) or os.access(folder, os.W_OK):
        return None
    return StoreError(
        f"{path}: cannot open the ledger to write: its folder {folder} is read-only for this process (a Ledger "
        "writes, and SQLite keeps the ledger's -wal and -shm files beside it); to read it, use "
        "Ledger.open(path, create=False) (reads work, writes are refused) or the CLI's read commands "
        "(status, log, explain, verify)"
    )


def check_key(event_id: object) -> None:
    """An idempotency key is a string (or None): anything else is refused before it is looked up."""
    if event_id is None:
        return
    if not isinstance(event_id, str):
        raise InputError(f"event_id must be a string, not {type(event_id).__name__} ({event_id!r})")
    text_or_error("event_id", event_id)


_SEMANTIC_ID_BY_KIND = {kind: semantic_id for semantic_id, kind in KIND_BY_SEMANTIC_ID.items()}
_SEMANTIC_ID_BY_KIND["rlvr"] = _SEMANTIC_ID_BY_KIND["grpo"]


@attrs.frozen
class BaselineManifest:
    """An SFT baseline: its adapter's sha256 is the active policy version."""

    path: str
    sha256: str
    adapter_path: str  # resolved by `resolve_artifact_path`
    adapter_path_as_written: str
    adapter_sha256: str


@attrs.frozen
class CandidateManifest:
    """A DPO or GRPO/RLVR candidate's manifest, reduced to what the checks read."""

    path: str
    sha256: str
    fields: JSON  # see `_candidate_fields`
    adapter: JSON = attrs.field(factory=dict)  # `artifacts.adapter` exactly as the manifest wrote it


_JSON_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def read_manifest(path: str | os.PathLike[str]) -> tuple[JSON, str, str]:
    """Load a manifest object; return it with its absolute path and file sha256."""
    p = Path(path)
    data = read_regular_file(p, what="manifest", limit=MAX_MANIFEST_BYTES)  # never a FIFO, a device or 10 GB
    try:
        obj = strict_loads(data)
    except ValueError as e:
        raise InputError(f"manifest {p} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InputError(f"manifest {p} must be a JSON object, not {_JSON_NAMES.get(type(obj), 'null')}")
    adapter = obj.get("artifacts", {}).get("adapter") if isinstance(obj.get("artifacts"), dict) else None
    if not isinstance(adapter, dict):
        raise InputError(f"manifest {p} lacks artifacts.adapter")
    if not isinstance(adapter.get("path"), str) or not adapter["path"]:
        raise InputError(f"manifest {p} lacks artifacts.adapter.path")
    path_argument(f"manifest {p}: artifacts.adapter.path", adapter["path"])
    return obj, os.path.normpath(p.absolute()), hashlib.sha256(data).hexdigest()


def resolve_artifact_path(written: str, manifest_path: str, root: str | os.PathLike[str] | None) -> str:
    """Where a manifest's artifact path leads: relative to `root` when one is given, else to the
    manifest file's folder; an absolute path stays itself. Lexical: links are judged by the hash."""
    base = os.path.abspath(root) if root is not None else os.path.dirname(os.path.abspath(manifest_path))
    return os.path.normpath(os.path.join(base, written))


def load_baseline_manifest(
    path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None
) -> BaselineManifest:
    """Parse an SFT manifest (`root`: see `resolve_artifact_path`); its adapter sha256 is the policy version."""
    obj, abs_path, digest = read_manifest(path)
    semantic_id = obj.get("semantic_id")
    if isinstance(semantic_id, str) and semantic_id in KIND_BY_SEMANTIC_ID:
        kind = KIND_BY_SEMANTIC_ID[semantic_id]
        raise InputError(f"{abs_path} is a {kind} candidate's manifest ({semantic_id}), not an SFT delivery")
    if obj.get("decision") == "reject":
        raise InputError(f"SFT manifest {abs_path} records decision reject: a rejected delivery is no baseline")
    adapter = obj["artifacts"]["adapter"]
    sha = adapter.get("sha256")
    if not isinstance(sha, str) or not sha:
        raise InputError(f"SFT manifest {abs_path} lacks artifacts.adapter.sha256 (the active policy version)")
    return BaselineManifest(
        path=abs_path,
        sha256=digest,
        adapter_path=resolve_artifact_path(adapter["path"], abs_path, root),
        adapter_path_as_written=adapter["path"],
        adapter_sha256=sha,
    )


def _preference_evidence(obj: JSON) -> Any:
    """DPO preference evidence identity: explicit, named in `source_evidence`, or the sha256 of it."""
    if "preference_evidence_version" in obj:
        return obj["preference_evidence_version"]
    evidence = obj.get("source_evidence")
    if isinstance(evidence, dict):
        for key in ("preference_evidence_version", "version"):
            if isinstance(evidence.get(key), str) and evidence[key]:
                return evidence[key]
    if isinstance(evidence, dict | list) and evidence:
        return "sha256:" + hashlib.sha256(canonical_json(evidence).encode()).hexdigest()
    return evidence if isinstance(evidence, str) else None


def _candidate_fields(obj: JSON, abs_path: str, root: str | os.PathLike[str] | None) -> JSON:
    semantic_id = obj.get("semantic_id")
    kind = obj.get("candidate_kind")
    if kind is None and isinstance(semantic_id, str):
        kind = KIND_BY_SEMANTIC_ID.get(semantic_id)
    trajectory = obj.get("trajectory_identity")
    verifier = trajectory.get("verifier_version") if isinstance(trajectory, dict) else None
    if verifier is None:
        verifier = obj.get("verifier_version")
    adapter = obj["artifacts"]["adapter"]
    return {
        "candidate_kind": kind,
        "semantic_id": semantic_id,
        "source_policy_version": obj.get("source_policy_version"),
        "policy_version": obj.get("policy_version"),
        "evaluation_version": obj.get("evaluation_version"),
        "preference_evidence_version": _preference_evidence(obj),
        "verifier_version": verifier,
        "evidence_window_index": obj.get("evidence_window_index"),
        "decision": obj.get("decision"),
        "adapter_path": adapter["path"],
        "adapter_resolved_path": resolve_artifact_path(adapter["path"], abs_path, root),
        "adapter_sha256": adapter.get("sha256"),
    }


def load_candidate_manifest(
    path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None
) -> CandidateManifest:
    """Parse a candidate manifest (`root`: see `resolve_artifact_path`); semantic gaps are kept for the checks."""
    obj, abs_path, digest = read_manifest(path)
    fields = _candidate_fields(obj, abs_path, root)
    return CandidateManifest(path=abs_path, sha256=digest, fields=fields, adapter=dict(obj["artifacts"]["adapter"]))


def check_kind(kind: object) -> str:
    """`kind` if it is a candidate kind (dpo, grpo, rlvr), else an InputError listing them (no close match
    suggested: a `ppo` run is not a misspelt `dpo`)."""
    if kind not in CANDIDATE_KINDS:
        raise InputError(f"unknown candidate kind {kind!r} (expected one of {', '.join(CANDIDATE_KINDS)})")
    return str(kind)


def _branch_evidence(
    kind: str, source_evidence_version: str | None, verifier_version: str | None, evidence_window_index: int | None
) -> JSON:
    """The evidence fields `kind`'s freshness check reads; a missing one is refused here, not rejected later."""
    if kind == "dpo":
        if not source_evidence_version:
            raise InputError("a dpo candidate manifest needs source_evidence_version (its preference data's version)")
        return {"source_evidence": {"version": source_evidence_version}}
    if not verifier_version:
        raise InputError(f"a {kind} candidate manifest needs verifier_version (the verifier that scored it)")
    if not isinstance(evidence_window_index, int) or isinstance(evidence_window_index, bool):
        raise InputError(
            f"a {kind} candidate manifest needs evidence_window_index as an integer, not {evidence_window_index!r}"
        )
    return {
        "trajectory_identity": {"verifier_version": verifier_version},
        "evidence_window_index": evidence_window_index,
    }


def baseline_manifest(*, adapter_path: str, adapter_sha256: str, **extra: Any) -> JSON:
    """An SFT baseline manifest: its adapter's sha256 becomes the active policy version."""
    return {
        "semantic_id": "PT-SFT-DELIVERY",
        "artifacts": {"adapter": {"path": adapter_path, "sha256": adapter_sha256}},
    } | extra


def candidate_manifest(
    *,
    candidate_id: str,
    kind: str,
    source_policy_version: str,
    adapter_path: str,
    adapter_sha256: str,
    evaluation_version: str,
    decision: str,
    source_evidence_version: str | None = None,
    verifier_version: str | None = None,
    evidence_window_index: int | None = None,
    **extra: Any,
) -> JSON:
    """A candidate manifest with every field the checks read for `kind`; `candidate_id` becomes its
    `policy_version` (so receiving it without an id finds the same candidate), `extra` fields are added."""
    identity = {"semantic_id": _SEMANTIC_ID_BY_KIND[check_kind(kind)]}
    if kind not in KIND_BY_SEMANTIC_ID.values():
        identity["candidate_kind"] = kind  # rlvr: the semantic id alone would read as grpo
    manifest: JSON = {
        **identity,
        "source_policy_version": source_policy_version,
        "policy_version": candidate_id,
        "evaluation_version": evaluation_version,
        **_branch_evidence(kind, source_evidence_version, verifier_version, evidence_window_index),
        "decision": decision,
        "artifacts": {"adapter": {"path": adapter_path, "sha256": adapter_sha256}},
    }
    return manifest | extra


def write_manifest(path: str | os.PathLike[str], manifest: JSON) -> Path:
    """Write `manifest` as JSON atomically: a reader sees the old file or the whole new one, never a part."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, indent=2)  # before any file: a value JSON cannot hold leaves nothing behind
    return write_atomic(target, text.encode("utf-8"))  # a deliverable others read: 0644
