"""How long a command keeps re-deciding after losing a race to another writer.

A lost race is normal when supervisors share a candidate: the command re-folds and
decides again. The first retry is immediate, later ones wait a jittered, doubling
delay (so writers that collided do not collide again in step), and `ConcurrencyError`
reaches the caller only once `deadline` seconds have passed since the command began.
"""

from __future__ import annotations

import random

import attrs

__all__ = ["DEFAULT_RETRY", "RetryPolicy"]


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


def _not_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be zero or more, not {value!r}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Bounded, jittered re-decide: `deadline` in seconds; delays between `base` and `cap` seconds."""

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
