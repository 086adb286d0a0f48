"""The provenance card a training run records with its candidate: which data, code, model and trainer.

Each candidate version must trace what produced it. `provenance_card` reads that from
the objects a trainer already holds, so nobody writes it by hand:

| card field | read from |
|---|---|
| `dataset.fingerprint` | `datasets.Dataset._fingerprint` (the library's own content fingerprint) |
| `code.git_commit`, `code.git_dirty` | `git` in the training script's folder; null when that is not a git checkout |
| `base_model.name`, `.config_sha256` | the config's `_name_or_path`; sha256 of its JSON minus name and version |
| `tokenizer.chat_template_sha256` | sha256 of the tokenizer's chat template (null without one) |
| `trainer.class`, `trainer.arguments_sha256` | the trainer's class; sha256 of its arguments minus run-local ones |
| `libraries` | installed versions of torch, transformers, trl, peft, accelerate, datasets, lifecycle-fsm |

A value that cannot be read is null, never a stand-in: a card never claims what it
does not know. Digests are sha256 over canonical JSON, so two runs with the same
inputs record the same card wherever their output folders are (a dataset's fingerprint
is as stable as `datasets` makes it: a transform it cannot hash gets a random one).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.store.chain import canonical_json

__all__ = ["LIBRARIES", "RUN_LOCAL_ARGUMENTS", "code_identity", "provenance_card"]


LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "lifecycle-fsm")
# Training arguments that name where or as which process a run writes, not how it trains.
RUN_LOCAL_ARGUMENTS = frozenset({"output_dir", "logging_dir", "run_name", "local_rank", "hub_token"})
# Config keys that say where a model was loaded from and by which release, not what it is.
_CONFIG_LOCAL_KEYS = frozenset({"_name_or_path", "transformers_version"})


def _digest(value: Any) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return hashlib.sha256(text.encode()).hexdigest()


def _git(folder: Path, *arguments: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def code_identity(folder: str | os.PathLike[str] | None = None) -> JSON:
    """The git commit of the training code and whether its tree differs from it (both null outside git).

    `folder` defaults to the running script's folder (the current folder without one).
    """
    if folder is None:
        script = getattr(sys.modules.get("__main__"), "__file__", None)
        folder = Path(script).resolve().parent if script else Path.cwd()
    commit = _git(Path(folder), "rev-parse", "HEAD")
    status = _git(Path(folder), "status", "--porcelain") if commit is not None else None
    return {
        "git_commit": commit.strip() if commit else None,
        "git_dirty": None if status is None else bool(status.strip()),
    }


def _dataset(dataset: object) -> JSON:
    fingerprint = getattr(dataset, "_fingerprint", None)
    rows = getattr(dataset, "num_rows", None)
    return {
        "fingerprint": fingerprint if isinstance(fingerprint, str) else None,
        "rows": rows if isinstance(rows, int) else None,
    }


def _as_json(value: object, method: str, **options: Any) -> JSON | None:
    """The library's own JSON of `value` (`to_json_string`), read back as a dict; None without one."""
    to_json = getattr(value, method, None)
    return json.loads(to_json(**options)) if callable(to_json) else None


def _base_model(model: object) -> JSON:
    config = getattr(model, "config", None)
    described = _as_json(config, "to_json_string", use_diff=False)
    if described is None:
        return {"name": None, "config_sha256": None}
    described = {k: v for k, v in described.items() if k not in _CONFIG_LOCAL_KEYS}
    name = getattr(config, "_name_or_path", None)
    return {"name": name or None, "config_sha256": _digest(described)}


def _tokenizer(tokenizer: object) -> JSON:
    template = getattr(tokenizer, "chat_template", None)
    return {"chat_template_sha256": None if template is None else _digest(template)}


def _trainer(trainer_class: type | None, arguments: object) -> JSON:
    described = _as_json(arguments, "to_json_string")
    digest = None
    if described is not None:
        digest = _digest({k: v for k, v in described.items() if k not in RUN_LOCAL_ARGUMENTS})
    name = None if trainer_class is None else f"{trainer_class.__module__}.{trainer_class.__qualname__}"
    return {"class": name, "arguments_sha256": digest}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def provenance_card(
    *,
    dataset: object,
    model: object,
    tokenizer: object,
    arguments: object,
    trainer_class: type | None,
    code_folder: str | os.PathLike[str] | None = None,
) -> JSON:
    """The card recorded when a candidate is registered (the module docstring's table)."""
    return {
        "dataset": _dataset(dataset),
        "code": code_identity(code_folder),
        "base_model": _base_model(model),
        "tokenizer": _tokenizer(tokenizer),
        "trainer": _trainer(trainer_class, arguments),
        "libraries": {name: _version(name) for name in LIBRARIES},
    }
