"""Pinned heads (`SEQ:HASH` or a signed-head file `seal` wrote), parsed strictly: a typo is named."""

from __future__ import annotations

import os
import re

import attrs
import orjson

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import MAX_INT64, MAX_SIGNED_HEAD_BYTES, read_regular_file

__all__ = ["ExpectedHead", "parse_expected_head"]

_HASH = re.compile(r"[0-9a-f]{64}")  # a sha256 as the chain stores it (and `verify --json` prints it)
# What a `SEQ:HASH` was meant to be: a (signed) whole number before the colon, or hex digits after it.
# A value of that shape that is no file is judged as a pin, so a typo is named, not "no such file".
_PIN_SHAPE = re.compile(r"([+-]?[0-9]+):(\S*)|([^\s/:]*):([0-9A-Fa-f]+)", re.ASCII)


@attrs.frozen
class ExpectedHead:
    """A head an auditor kept outside the file: `SEQ:HASH`, or a signed-head file."""

    seq: int
    hash: str
    source: str
    signed: JSON | None = None  # the signed-head document, when read from a file


def parse_expected_head(value: str) -> ExpectedHead:
    """`SEQ:HASH` (a seq from 1, the 64-lowercase-hex hash there), or the path of a file `seal` wrote; a
    value of that shape that is no file and not a pin is refused saying which part is wrong."""
    pin = _PIN_SHAPE.fullmatch(value.strip())
    if pin is not None and not (os.path.lexists(value) and not _is_pin(pin)):
        seq_text, digest = (pin.group(1), pin.group(2)) if pin.group(1) is not None else (pin.group(3), pin.group(4))
        problem = _seq_problem(seq_text) or _hash_problem(digest)
        if problem:
            raise InputError(f"--expect-head {value!r}: {problem}; give SEQ:HASH as `verify --json` prints the head")
        return ExpectedHead(int(seq_text.lstrip("0")), digest, value)  # leading zeros: not for int() to count
    try:  # a FIFO, a device or a huge file is refused, never read without end
        text = read_regular_file(value, what="file", limit=MAX_SIGNED_HEAD_BYTES)
    except InputError as e:
        shape = "SEQ:HASH (a seq and the 64-hex-digit hash)"
        raise InputError(f"--expect-head {value!r} is neither {shape} nor a readable signed-head file ({e})") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{value}: not a signed-head file (not JSON: {e})") from e
    if not isinstance(doc, dict):
        raise InputError(f"{value}: not a signed-head file (not an object)")
    seq, digest = doc.get("seq"), doc.get("hash")
    if type(seq) is not int or _seq_problem(str(seq)) or not isinstance(digest, str) or _hash_problem(digest):
        raise InputError(
            f"{value}: a signed-head file needs an integer `seq` from 1 and a `hash` of 64 lowercase hex digits"
        )
    return ExpectedHead(seq, digest, os.fspath(value), doc)


def _is_pin(match: re.Match[str]) -> bool:
    """A well-formed `SEQ:HASH` (it wins over a file of that name, as it always has)."""
    return match.group(1) is not None and not _seq_problem(match.group(1)) and not _hash_problem(match.group(2))


def _seq_problem(text: str) -> str | None:
    """Why `text` is not a seq a pinned head can name: a whole number from 1 (seq 0 is the genesis, no event)."""
    if not (text.isascii() and text.isdigit()):
        return f"the seq {text!r} is not a whole number from 1"
    digits = text.lstrip("0")
    if not digits:
        return "seq 0 is not an event (the chain starts at seq 1)"
    if len(digits) > 19 or int(digits) > MAX_INT64:  # (int() refuses 4300+ digits: never asked)
        return "no seq is that large"
    return None


def _hash_problem(digest: str) -> str | None:
    """Why `digest` is not a hash of the chain: 64 lowercase hex digits."""
    if _HASH.fullmatch(digest):
        return None
    if _HASH.fullmatch(digest.lower()):
        found = "it is in upper case"
    elif re.fullmatch(r"[0-9A-Fa-f]*", digest):
        found = f"it has {len(digest)} hex digits" if digest else "it is empty"
    else:
        found = "it has a character that is not a hex digit"
    return f"the hash is not 64 lowercase hex digits ({found})"
