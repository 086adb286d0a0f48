"""The mutation check's targets name code that exists: a function renamed or moved would
otherwise stop the check for its guarantee (the script refuses a missing name, but only
when someone runs it)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "mutation"))
import mutate
from mutation_ops import all_sites


@pytest.mark.parametrize("target", mutate.TARGETS, ids=lambda t: t.name)
def test_every_target_names_existing_code_with_sites_to_mutate(target: mutate.Target) -> None:
    tree = ast.parse((mutate.REPO / target.module).read_text())
    assert all_sites(tree, target.functions, target.tables, target.sql)
    assert all((mutate.REPO / test).is_file() for test in target.tests)
