"""The trainer tests: real transformers/TRL training of a tiny model built here, nothing downloaded.

They need the `trainer` extra: without it each module skips naming the install command
(`support.require_training_stack`); under CI=true a missing stack is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The training libraries' own notices (peft and TRL calling transformers' v6-deprecated names) are theirs."""
    theirs = pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(theirs)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A tiny base model and its SFT adapter, built once per session (read-only for the tests)."""
    from trainer.support import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"))
