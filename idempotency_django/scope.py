"""Who a key belongs to: the principal and the location (tenant)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.http import HttpRequest

from idempotency_django.conf import header, idempotency_settings
from idempotency_django.keys import InvalidKey, parse_key

MAX_LOCATION_LENGTH = 255
#: Starts the name of a user that is not a model; a model's label never does.
OBJECT_PREFIX = "class:"


@dataclass(frozen=True)
class Scope:
    """A key is unique within a scope; no scope ever sees another's responses."""

    principal: str
    location: str = ""


def principal_of(user: Any) -> str | None:
    """A name for an authenticated user that no other user shares; None for anyone else.

    ``app_label.model:pk`` for a model user of the default database (as 0.1
    named every model user, so its records keep replaying),
    ``app_label.model@alias:pk`` for one of another database (user 1 of two
    tenant databases are two people), ``class:module.QualName:pk`` for a
    user object that is not a model (two ``ApiClient`` classes in two modules
    are two kinds of client).
    """
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    if pk is None:
        return None
    meta = getattr(user, "_meta", None)
    if meta is None:
        kind = type(user)
        return f"{OBJECT_PREFIX}{kind.__module__}.{kind.__qualname__}:{pk}"
    alias = getattr(getattr(user, "_state", None), "db", None) or DEFAULT_DB_ALIAS
    if alias == DEFAULT_DB_ALIAS:
        return f"{meta.label_lower}:{pk}"
    return f"{meta.label_lower}@{alias}:{pk}"


def legacy_principal_of(user: Any) -> str | None:
    """The name 0.1 gave a user that is not a model (its bare class name), else None.

    Only these names changed for users 0.1 could name (a model user of
    another database was named as one of the default database, and that name
    now belongs to the latter alone: it cannot be looked up for the former).
    """
    if getattr(user, "_meta", None) is not None or principal_of(user) is None:
        return None
    return f"{type(user).__qualname__}:{user.pk}"


def default_scope(request: HttpRequest) -> Scope | None:
    """The authenticated user and the ``X-Location-Id`` header.

    ``request`` is the Django request on the middleware path and DRF's
    ``Request`` on the DRF path, so ``request.user`` is whoever the active
    authentication resolved (a session user, a token's user, ...).
    Returns None for an anonymous request.
    """
    user = getattr(request, "user", None)
    principal = principal_of(user)
    if principal is None:
        return None
    location = location_of(request)
    legacy = legacy_principal_of(user)
    if legacy is not None and _holds(request, legacy, location):
        # A retry of a request 0.1 stored: answer it from that record. Costs
        # one store read per keyed request of such users (docs/security.md).
        principal = legacy
    return Scope(principal=principal, location=location)


def _holds(request: HttpRequest, principal: str, location: str) -> bool:
    from idempotency_django.stores import RecordKey, StoreUnavailable, get_store

    raw_key = header(request, idempotency_settings.HEADER)
    if raw_key is None:
        return False
    try:
        key = parse_key(raw_key)
        return get_store().peek(RecordKey(principal, location, key)) is not None
    except (InvalidKey, StoreUnavailable):
        return False  # the claim answers these itself


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
