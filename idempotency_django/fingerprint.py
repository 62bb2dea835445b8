"""What makes two requests "the same request": method, full path and raw body."""

from __future__ import annotations

import hashlib

from django.http import HttpRequest


def default_fingerprint(request: HttpRequest) -> str:
    """SHA-256 over the method, the path with its query string, and the body bytes.

    Only the digest is kept; the body itself is never stored.
    """
    digest = hashlib.sha256()
    digest.update(request.method.encode("ascii") if request.method else b"")
    digest.update(b"\n")
    digest.update(request.get_full_path().encode("utf-8", "surrogateescape"))
    digest.update(b"\n")
    digest.update(request.body)
    return digest.hexdigest()
