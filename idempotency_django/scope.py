"""Who a key belongs to: the principal and the location (tenant)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from idempotency_django.conf import header, idempotency_settings

MAX_LOCATION_LENGTH = 255


@dataclass(frozen=True)
class Scope:
    """A key is unique within a scope; no scope ever sees another's responses."""

    principal: str
    location: str = ""


def principal_of(user: Any) -> str | None:
    """``app_label.model:pk`` for an authenticated user, None for anyone else."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    if pk is None:
        return None
    meta = getattr(user, "_meta", None)
    label = meta.label_lower if meta is not None else type(user).__qualname__
    return f"{label}:{pk}"


def default_scope(request: HttpRequest) -> Scope | None:
    """The authenticated user and the ``X-Location-Id`` header.

    ``request`` is the Django request on the middleware path and DRF's
    ``Request`` on the DRF path, so ``request.user`` is whoever the active
    authentication resolved (a session user, a token's user, ...).
    Returns None for an anonymous request.
    """
    principal = principal_of(getattr(request, "user", None))
    if principal is None:
        return None
    return Scope(principal=principal, location=location_of(request))


def session_scope(request: HttpRequest) -> Scope | None:
    """An anonymous visitor's scope: their Django session, started if there is none.

    For ``ANONYMOUS = "session"``: a guest checkout or a public form gets the
    protection a logged-in user gets, and one session never sees another's
    responses. The principal is a digest of the session key (a credential,
    never stored as such). Needs ``SessionMiddleware``; None without it.
    """
    session = getattr(request, "session", None)
    if session is None:
        return None
    if session.session_key is None:
        session.save()  # SessionMiddleware sends its cookie with the response
    digest = hashlib.sha256(str(session.session_key).encode()).hexdigest()
    return Scope(principal=f"session:{digest}", location=location_of(request))


def location_of(request: HttpRequest) -> str:
    name = idempotency_settings.LOCATION_HEADER
    if not name:
        return ""
    return (header(request, name) or "").strip()
