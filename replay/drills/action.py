"""The base of every step class, and the value checks the step classes share."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from lifecycle_fsm.replay.drills.convert import Problem

__all__ = ["Action", "between", "not_negative"]


class Action:
    """One kind of step. `name` is its key in the file; `shorthand` the key a scalar fills
    (`check: dpo-v5` means `check: {candidate: dpo-v5}`); `command` marks ledger commands,
    the only steps that may carry `refused:` (or run inside `crash` and `concurrently`)."""

    name: ClassVar[str]
    shorthand: ClassVar[str | None] = None
    command: ClassVar[bool] = False


def between(low: int, high: int, problem: str) -> Any:
    def check(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
        if not low <= value <= high:
            raise Problem(problem, key=attribute.name)

    return check


def not_negative(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise Problem("must not be negative", key=attribute.name)
