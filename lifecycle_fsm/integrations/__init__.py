"""Integrations with training libraries, each behind its own optional extra.

`lifecycle_fsm.integrations.transformers.LedgerCallback` needs the `trainer` extra
(transformers, with TRL, PEFT, accelerate and datasets); importing this package alone
loads none of them.
"""

from __future__ import annotations

__all__: list[str] = []
