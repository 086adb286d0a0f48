"""What a snapshot of folded state was produced by, so a stale one is never trusted.

A checkpoint records this fingerprint: the machine's table, the rules and the fold
(source digests). Any change to them makes older snapshots structurally different
(seed 001's rule: say which part differs and do not use it).
"""

from __future__ import annotations

import hashlib
import inspect
from types import ModuleType

from lifecycle_fsm import events, machine, rules, state
from store.chain import canonical_json

__all__ = ["CHECKPOINT_SCHEMA_VERSION", "FINGERPRINT", "FINGERPRINT_PARTS"]

CHECKPOINT_SCHEMA_VERSION = 1


def _source_digest(*modules: ModuleType) -> str:
    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()


FINGERPRINT_PARTS = {
    "machine": machine.FINGERPRINT,
    "rules": _source_digest(rules),
    "fold": _source_digest(state, events),
}
FINGERPRINT = canonical_json(FINGERPRINT_PARTS)
