"""How a store names and matches a record: digests of its key, and its fingerprint's match."""

from __future__ import annotations

import hashlib
import hmac


def same_request(stored: str, fingerprint: str) -> bool:
    """Whether a record's ``stored`` fingerprint names the request ``fingerprint`` came from."""
    if hmac.compare_digest(stored.encode(), fingerprint.encode()):
        return True
    others = getattr(fingerprint, "alternatives", ())
    return any(hmac.compare_digest(stored.encode(), other.encode()) for other in others)


def record_digest(principal: str, location: str, key: str) -> str:
    """SHA-256 (hex) of a key within its scope: what a store finds its record by.

    Exact whatever the database's collation (MySQL's compare case- and
    space-insensitively), and fixed-length whatever the lengths of the parts.
    """
    material = "\x1f".join((principal, location, key)).encode("utf-8", "surrogateescape")
    return hashlib.sha256(material).hexdigest()


def readable_value(value: str, length: int = 255) -> str:
    """``value`` for a text column of ``length`` characters: itself, or its digest if longer.

    Records keep the principal and the location for people to read; the
    record's identity is :func:`record_digest`, over the full values.
    """
    if len(value) <= length:
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def key_digest(principal: str, location: str, key: str) -> str:
    """A short non-reversible label for logs: identifies a key without printing it."""
    return record_digest(principal, location, key)[:16]
