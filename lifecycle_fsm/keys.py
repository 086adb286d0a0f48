"""Ed25519 signing keys (`cryptography`): a private key is unencrypted PKCS#8 PEM (0600), a public key
SubjectPublicKeyInfo PEM, a key's id the sha256 hex of its 32 raw public bytes.

`cryptography` is imported where a key is used, not with the module: `verify` without `--pubkey`
should not pay for the import.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.folders import make_folder
from lifecycle_fsm.limits import MAX_KEY_BYTES, read_regular_file
from lifecycle_fsm.outputs import write_atomic

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


@attrs.frozen
class KeyFiles:
    """A new key pair on disk and its id."""

    key_id: str
    private_key: Path
    public_key: Path


def key_id(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the 32 raw public-key bytes: how seals and attestations name their key."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def new_key_pair(out: str | os.PathLike[str]) -> KeyFiles:
    """Write `DIR/lifecycle-signing.key` (0600) and `.pub`, each whole or not at all; refuse to overwrite either."""
    folder = Path(out)
    private_path, public_path = folder / "lifecycle-signing.key", folder / "lifecycle-signing.pub"
    make_folder(folder, "key folder")
    if public_path.exists():
        raise InputError(f"{public_path} already exists: a key pair is never overwritten")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key()
    public_pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    write_atomic(private_path, pem, mode=0o600, exclusive=True)  # whole or absent: never a 0-byte "key"
    try:
        write_atomic(public_path, public_pem, exclusive=True)
    except BaseException:
        private_path.unlink()  # ours, written a moment ago: a pair or nothing
        raise
    return KeyFiles(key_id(public), private_path, public_path)


def _private_key(pem: bytes, where: str) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise InputError(f"{where} is not an unencrypted PEM private key ({e})") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{where} is not an Ed25519 key (lifecycle key new makes one)")
    return key


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PKCS#8 PEM file of at most MAX_KEY_BYTES; anything else is an input error."""
    return _private_key(read_regular_file(path, what="signing key", limit=MAX_KEY_BYTES), os.fspath(path))


def private_key_from(value: str | os.PathLike[str] | bytes | Ed25519PrivateKey, what: str) -> Ed25519PrivateKey:
    """A signing key given as a key object, PEM bytes, or the path of a PEM file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if isinstance(value, Ed25519PrivateKey):
        return value
    if isinstance(value, bytes):
        return _private_key(value, f"{what}: the signing key")
    return load_private_key(value)


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from SubjectPublicKeyInfo PEM; anything else is an input error."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    pem = read_regular_file(path, what="public key", limit=MAX_KEY_BYTES)  # a FIFO or /dev/zero: InputError
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        raise InputError(f"{os.fspath(path)} is not a PEM public key ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{os.fspath(path)} is not an Ed25519 public key")
    return key


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    """An Ed25519 signature, base64 (standard alphabet)."""
    return base64.b64encode(key.sign(message)).decode()


class PublicKeys:
    """The keys an auditor trusts, by id: a signature under any other key is refused."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self.by_id = {key_id(k): k for k in keys}

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]]) -> PublicKeys:
        return cls(load_public_key(p) for p in paths)

    def __bool__(self) -> bool:
        return bool(self.by_id)

    def verifies(self, signer_id: str, message: bytes, signature: str) -> bool:
        """Whether `signature` is `signer_id`'s over `message` and that key is one of ours."""
        key = self.by_id.get(signer_id)
        if key is None:
            return False
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(base64.b64decode(signature, validate=True), message)
        except (InvalidSignature, binascii.Error, ValueError, TypeError):
            return False
        return True
