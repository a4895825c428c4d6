"""Signed values for the remote store: ``b"FXCGSIG1"``, HMAC-SHA256 over the Redis key
name, a NUL and the payload under a shared secret, then the payload; and the namespace a
secret's keys live under (:func:`fingerprint`)."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SIG_MAGIC", "fingerprint", "sign", "unsign"]

SIG_MAGIC = b"FXCGSIG1"
_SIG_LEN = 32


def sign(secret: bytes, name: str, payload: bytes) -> bytes:
    """The signed value stored under the Redis key ``name``."""
    mac = hmac.new(secret, name.encode() + b"\x00" + payload, hashlib.sha256).digest()
    return SIG_MAGIC + mac + payload


def unsign(secret: bytes, name: str, value: bytes) -> bytes | None:
    """The payload of a signed value, or None when it is not signed under ``secret`` for
    the key ``name`` (truncated, altered, moved from another key, or foreign)."""
    head = len(SIG_MAGIC) + _SIG_LEN
    if not isinstance(value, bytes) or len(value) < head or not value.startswith(SIG_MAGIC):
        return None
    payload = value[head:]
    mac = hmac.new(secret, name.encode() + b"\x00" + payload, hashlib.sha256).digest()
    return payload if hmac.compare_digest(mac, value[len(SIG_MAGIC) : head]) else None


def fingerprint(secret: bytes) -> str:
    """The namespace of a secret's objects: 16 hex digits of an HMAC under it (the secret
    cannot be recovered from it)."""
    return hmac.new(secret, b"fxcodegen remote namespace", hashlib.sha256).hexdigest()[:16]
