"""The provenance card: read from the objects a trainer holds, stable across output folders, null when unknown."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from lifecycle_fsm.integrations.provenance import LIBRARIES, code_identity, provenance_card
from trainer.support import Tiny, require_training_stack

require_training_stack()


def _card(tiny: Tiny, output: Path, **changes: Any) -> dict[str, Any]:
    from trl import DPOTrainer

    from examples.tiny_model import dpo_config, policy, preference_data, tokenizer

    return provenance_card(
        dataset=preference_data(),
        model=policy(tiny.base, tiny.sft),
        tokenizer=tokenizer(tiny.base),
        arguments=dpo_config(output, **changes),
        trainer_class=DPOTrainer,
    )


def test_the_card_names_data_model_template_trainer_and_libraries(tiny: Tiny, tmp_path: Path) -> None:
    from examples.tiny_model import CHAT_TEMPLATE, preference_data

    card = _card(tiny, tmp_path / "out")
    assert card["dataset"] == {"fingerprint": preference_data()._fingerprint, "rows": 16}
    assert card["base_model"]["name"] == str(tiny.base)
    assert card["tokenizer"]["chat_template_sha256"] == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    assert card["trainer"]["class"] == "trl.trainer.dpo_trainer.DPOTrainer"
    assert card["libraries"] == {name: metadata.version(name) for name in LIBRARIES}
    assert set(card["code"]) == {"git_commit", "git_dirty"}


def test_digests_do_not_depend_on_where_a_run_writes(tiny: Tiny, tmp_path: Path) -> None:
    """Two runs differing only in output folder record one card; a changed argument changes its digest."""
    first, second = _card(tiny, tmp_path / "a"), _card(tiny, tmp_path / "b")
    assert first == second
    assert _card(tiny, tmp_path / "a", learning_rate=1e-3)["trainer"] != first["trainer"]


def test_a_model_loaded_from_elsewhere_has_the_same_config_digest(tiny: Tiny, tmp_path: Path) -> None:
    import shutil

    moved = Path(shutil.copytree(tiny.base, tmp_path / "moved"))
    card = _card(Tiny(base=moved, sft=tiny.sft), tmp_path / "out")
    assert card["base_model"]["name"] == str(moved)
    assert card["base_model"]["config_sha256"] == _card(tiny, tmp_path / "out")["base_model"]["config_sha256"]


def test_code_outside_a_git_checkout_is_null(tmp_path: Path) -> None:
    assert code_identity(tmp_path) == {"git_commit": None, "git_dirty": None}


def test_code_in_a_git_checkout_names_its_commit_and_dirt(tmp_path: Path) -> None:
    def git(*arguments: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *arguments], capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "train.py").write_text("print('train')\n")
    git("add", "train.py")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "train")
    assert code_identity(tmp_path) == {"git_commit": git("rev-parse", "HEAD"), "git_dirty": False}
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert code_identity(tmp_path)["git_dirty"] is True


def test_what_cannot_be_read_is_null() -> None:
    card = provenance_card(dataset=None, model=None, tokenizer=None, arguments=None, trainer_class=None)
    assert card["dataset"] == {"fingerprint": None, "rows": None}
    assert card["base_model"] == {"name": None, "config_sha256": None}
    assert card["tokenizer"] == {"chat_template_sha256": None}
    assert card["trainer"] == {"class": None, "arguments_sha256": None}
