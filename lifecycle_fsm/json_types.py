"""`JSON`: a JSON object as it is read or written at the edges (payloads, records, reports), and the
strict reading of a file a person wrote (a manifest, a decision)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["JSON", "KeyGivenTwice", "strict_loads"]

JSON = dict[str, Any]


class KeyGivenTwice(ValueError):
    """An object with a key given twice says two things; a lenient reader would keep the last one silently."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r}: given twice")
        self.key = key


def strict_loads(text: str | bytes) -> Any:
    """JSON as RFC 8259 defines it, read strictly: a key given twice (`KeyGivenTwice`), NaN or Infinity,
    or nesting too deep to read is a ValueError saying which, never a silent pick or a RecursionError."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_not_a_number)
    except RecursionError:  # `[[[…]]]` 100,000 deep fits any size limit; json recurses per level
        raise ValueError("nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> JSON:
    doc: JSON = {}
    for key, value in pairs:
        if key in doc:
            raise KeyGivenTwice(key)
        doc[key] = value
    return doc


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")
