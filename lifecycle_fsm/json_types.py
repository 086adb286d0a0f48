"""`JSON`, the one alias for a JSON object, and the strict reading of a file a person wrote."""

from __future__ import annotations

import json
from typing import Any

import orjson

JSON = dict[str, Any]


class KeyGivenTwice(ValueError):
    """An object with a key given twice says two things; a lenient reader would keep the last one silently."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r}: given twice")
        self.key = key


def strict_loads(text: str | bytes) -> Any:
    """RFC 8259 JSON read strictly: what orjson refuses, or a key given twice (`KeyGivenTwice`), is a
    ValueError saying which, never a silent pick."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ValueError(str(e)) from None
    json.loads(text, object_pairs_hook=_unique_keys)  # orjson keeps a repeated key's last value
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> JSON:
    doc: JSON = {}
    for key, value in pairs:
        if key in doc:
            raise KeyGivenTwice(key)
        doc[key] = value
    return doc
