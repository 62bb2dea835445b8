"""Who a key belongs to: the principal and the location (tenant)."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, router
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.crypto import salted_hmac
from django.utils.module_loading import import_string

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.keys import InvalidKey, parse_key
from idempotency_django.protocol.marks import key_header, meta_name

MAX_LOCATION_LENGTH = 255
#: Starts the name of a user that is not a model; a model's label never does.
OBJECT_PREFIX = "class:"
#: Keeps the HMACs that name principals apart from every other use of ``SECRET_KEY``.
PRINCIPAL_SALT = "idempotency_django.principal"


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
        # Not type(): Django's lazy request.user is a SimpleLazyObject, whose __class__
        # is its user's. Every kind of user would share the one name otherwise.
        kind = user.__class__
        return f"{OBJECT_PREFIX}{kind.__module__}.{kind.__qualname__}:{pk}"
    return model_principal(user, meta.label_lower, pk)


def model_principal(instance: Any, label: str, pk: Any) -> str:
    """``label:pk`` for a model instance of the default database, ``label@alias:pk`` for
    one of another (user 1 of two tenant databases are two people).

    The database is the one a write of the instance goes to: not the one it was read
    from, which under a replica router names one instance twice (a retry whose user was
    read from another replica would be another principal, and run again). Without
    routers, it is the one it was read from.
    """
    alias = router.db_for_write(instance.__class__, instance=instance) or DEFAULT_DB_ALIAS
    if alias == DEFAULT_DB_ALIAS:
        return f"{label}:{pk}"
    return f"{label}@{alias}:{pk}"


def legacy_principal_of(user: Any) -> str | None:
    """The name 0.1 gave a user that is not a model (its bare class name), else None.

    Only these names changed for users 0.1 could name (a model user of
    another database was named as one of the default database, and that name
    now belongs to the latter alone: it cannot be looked up for the former).
    """
    if getattr(user, "_meta", None) is not None or principal_of(user) is None:
        return None
    return f"{user.__class__.__qualname__}:{user.pk}"


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
    # A model user (the most common) has no legacy name: no call to find that out.
    legacy = None if getattr(user, "_meta", None) is not None else legacy_principal_of(user)
    if legacy is not None and _holds(request, legacy, location):
        # A retry of a request 0.1 stored: answer it from that record. Costs
        # one store read per keyed request of such users (docs/security.md).
        principal = legacy
    return Scope(principal=principal, location=location)


def credential_digests(credential: str | bytes) -> list[str]:
    """HMAC-SHA256 of a credential under ``SECRET_KEY``, then under each key of
    ``SECRET_KEY_FALLBACKS``: what a principal made of it is named by, never the
    credential or a plain hash of it (staff who read principals in the admin could
    otherwise hash guesses of a short API key until one matches)."""
    keys = (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS)
    return [
        salted_hmac(PRINCIPAL_SALT, credential, secret=key, algorithm="sha256").hexdigest()
        for key in keys
    ]


def credential_principal(request: HttpRequest, prefix: str, credential: str | bytes) -> str:
    """``prefix`` and the keyed digest of ``credential`` that names this request's principal.

    Under ``SECRET_KEY``, unless a key of ``SECRET_KEY_FALLBACKS`` named a record
    that still holds the request's key: a retry across a ``SECRET_KEY`` rotation
    finds its record. That costs one store read per fallback key, only for a keyed
    request and only while fallbacks are set (the rotation's window); without
    them, the claim is the only read, as before.
    """
    current, *earlier = (prefix + digest for digest in credential_digests(credential))
    if earlier:
        location = location_of(request)
        for principal in earlier:
            if _holds(request, principal, location):
                return principal
    return current


def _holds(request: HttpRequest, principal: str, location: str) -> bool:
    from idempotency_django.stores import RecordKey, StoreUnavailable, get_store

    raw_key = key_header(request, idempotency_settings.HEADER)
    if raw_key is None:
        return False
    try:
        key = parse_key(raw_key)
        return get_store().peek(RecordKey(principal, location, key)) is not None
    except (InvalidKey, StoreUnavailable):
        return False  # the claim answers these itself


#: The session entry that names a guest for ``ANONYMOUS = "session"``.
GUEST_ENTRY = "_idempotency_guest"
SIGNED_COOKIES = "django.contrib.sessions.backends.signed_cookies"


def session_scope(request: HttpRequest) -> Scope | None:
    """An anonymous visitor's scope: their Django session, started if there is none.

    For ``ANONYMOUS = "session"``: a guest checkout or a public form gets the
    protection a logged-in user gets, and one session never sees another's
    responses. The principal is a keyed digest of the session key (a
    credential, never stored as such: :func:`credential_principal`). Needs
    ``SessionMiddleware``; None without it.

    A session is started only for a request the CSRF check lets through
    (one it refuses is not protected: it must not leave a session behind).
    With signed-cookie sessions the session key is the signed session data,
    the same for two new guests in the same second and a new one whenever the
    data changes: the guest is named by a random id kept in the session
    instead (``GUEST_ENTRY``).
    """
    session = getattr(request, "session", None)
    if session is None:
        return None
    location = location_of(request)
    if not valid_location(location):
        # Refused (400) before anything is looked up: no session is started for it.
        return Scope(principal="session:", location=location)
    if _named_by_entry(session):
        name = session.get(GUEST_ENTRY)
        if name is None:
            if csrf_refuses(request):
                return None  # the view answers 403; no guest was named for it
            name = secrets.token_urlsafe(24)
            session[GUEST_ENTRY] = name  # sent with the response's cookie
    else:
        if session.session_key is None:
            if csrf_refuses(request):
                return None  # the view answers 403; no session was started for it
            session.save()  # SessionMiddleware sends its cookie with the response
        name = str(session.session_key)
    return Scope(principal=credential_principal(request, "session:", name), location=location)


def _named_by_entry(session: Any) -> bool:
    return type(session).__module__ == SIGNED_COOKIES


def csrf_refuses(request: HttpRequest) -> bool:
    """Whether the project's CSRF middleware will refuse this request's view.

    Asked before a guest's session is started. Accepting marks the request
    as checked, so the real check does not run twice; a refusal is left to
    the real check, which answers it.
    """
    from idempotency_django.protocol.routes import match_of

    request = getattr(request, "_request", request)  # DRF's Request wraps Django's
    if getattr(request, "csrf_processing_done", False):
        return False
    match = match_of(request)
    if match is None:
        return False
    for path in getattr(settings, "MIDDLEWARE", None) or []:
        try:
            middleware = import_string(path)
        except ImportError:
            continue
        if isinstance(middleware, type) and issubclass(middleware, CsrfViewMiddleware):
            check = middleware(lambda request: HttpResponse())
            with _quiet_csrf_log():
                refused = check.process_view(request, match.func, match.args, match.kwargs)
            if refused is not None:
                return True
    return False


@contextlib.contextmanager
def _quiet_csrf_log() -> Iterator[None]:
    """The real check logs its refusal; this early one must not log it twice."""
    logger = logging.getLogger("django.security.csrf")
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def valid_location(location: str) -> bool:
    """What phase 1 accepts as a location; it answers 400 to anything else."""
    return len(location) <= MAX_LOCATION_LENGTH and location.isprintable()


def location_of(request: HttpRequest) -> str:
    name = idempotency_settings.LOCATION_HEADER
    if not name:
        return ""
    # header(), without the call, on Django's request: read for every keyed request.
    meta = getattr(request, "_request", request).META
    return str(meta.get(meta_name(name)) or "").strip()
