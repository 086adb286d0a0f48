"""How long a command keeps re-deciding after losing a race: the first retry is immediate, later
ones wait a jittered, doubling delay, and `ConcurrencyError` reaches the caller only past `deadline`."""

from __future__ import annotations

import random

import attrs

from lifecycle_fsm.errors import InputError


def _seconds(name: str, value: object) -> float:
    """A number of seconds (an int or a float, not a bool), else an InputError naming the field."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InputError(f"RetryPolicy: {name} must be a number of seconds, not {value!r}")
    return value


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not _seconds(attribute.name, value) > 0:
        raise InputError(f"RetryPolicy: {attribute.name} must be positive, not {value!r}")


def _not_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not _seconds(attribute.name, value) >= 0:
        raise InputError(f"RetryPolicy: {attribute.name} must be zero or more, not {value!r}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Bounded, jittered re-decide: `deadline` in seconds; delays between `base` and `cap` seconds.
    A value that is not a number, or out of range (NaN included), is an `InputError`."""

    deadline: float = attrs.field(default=30.0, validator=_not_negative)  # 0: never re-decide
    base: float = attrs.field(default=0.001, validator=_positive)
    cap: float = attrs.field(default=0.05, validator=_positive)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `attempt` (1-based): none, then full jitter."""
        if attempt <= 1:
            return 0.0
        upper = min(self.cap, self.base * 2**attempt)
        return (rng or random).uniform(0, upper)


DEFAULT_RETRY = RetryPolicy()
