"""`JSON`: a JSON object as it is read or written at the edges (payloads, records, reports)."""

from __future__ import annotations

from typing import Any

__all__ = ["JSON"]

JSON = dict[str, Any]
