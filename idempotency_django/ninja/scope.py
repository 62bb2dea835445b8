"""Whose key a django-ninja request carries: the principal ninja authenticated."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.scope import (
    Scope,
    credential_digests,
    credential_principal,
    location_of,
    model_principal,
    principal_of,
)

#: An authentication result names its principal with this attribute (or property).
PRINCIPAL_ATTRIBUTE = "idempotency_principal"
#: Starts the name of an authentication result that is a string: a digest, never the secret.
SECRET_PREFIX = "secret:"
#: On a request of a protected operation: the auth callback that authenticated it
#: (ninja keeps only what it returned, in ``request.auth``).
AUTHENTICATED_BY_ATTRIBUTE = "_idempotency_authenticated_by"


def auth_principal(auth: Any, authenticated_by: Any = None) -> str | None:
    """A name for what ninja's authentication returned (``request.auth``); None for nobody.

    The table of docs/ninja.md, in its order: an ``idempotency_principal`` attribute's
    value; a user's name as the middleware and DRF give it; ``app_label.model:pk`` (or
    ``app_label.model@alias:pk``) for a model instance whose pk is a number or a UUID,
    and an HMAC of the pk with ``SECRET_KEY`` in place of any other pk (DRF's ``Token``
    is keyed by the bearer secret itself); for a string or bytes, ``secret:``, the auth
    class that returned it (``authenticated_by``) and an HMAC of it with ``SECRET_KEY``,
    never the credential itself. Anything else names nobody it could be told apart from:
    :class:`~django.core.exceptions.ImproperlyConfigured`, before the key is claimed.
    """
    return _principal(auth, authenticated_by, _keyed)


def ninja_scope(request: HttpRequest) -> Scope | None:
    """The principal ninja authenticated (``request.auth``) and the ``X-Location-Id`` header;
    without ninja authentication, the ``SCOPE_FUNCTION`` setting's, as on a plain view."""
    if not hasattr(request, "auth"):
        scope: Scope | None = idempotency_settings.SCOPE_FUNCTION(request)
        return scope
    # A credential under SECRET_KEY, or a fallback's that still holds the request's key.
    keyed = functools.partial(credential_principal, request)
    via = getattr(request, AUTHENTICATED_BY_ATTRIBUTE, None)
    principal = _principal(request.auth, via, keyed)
    return None if principal is None else Scope(principal=principal, location=location_of(request))


def _principal(
    auth: Any, authenticated_by: Any, keyed: Callable[[str, str | bytes], str]
) -> str | None:
    """:func:`auth_principal`, whose credentials ``keyed(prefix, credential)`` names."""
    if auth is None or auth is False:
        return None
    named = getattr(auth, PRINCIPAL_ATTRIBUTE, None)
    if named is not None:
        value = named() if callable(named) else named
        return str(value) if value else None
    if hasattr(auth, "is_authenticated"):
        return principal_of(auth)
    meta = getattr(auth, "_meta", None)
    pk = getattr(auth, "pk", None)
    if meta is not None and pk is not None:
        if isinstance(pk, int | UUID):
            return model_principal(auth, meta.label_lower, pk)
        # A text pk may be the credential itself (DRF's Token, an API-key row): its digest.
        return keyed(model_principal(auth, meta.label_lower, ""), str(pk))
    if isinstance(auth, str | bytes):
        return keyed(secret_prefix(authenticated_by), auth)
    raise ImproperlyConfigured(
        f"idempotency_django.ninja cannot name the principal of the authentication "
        f"result {type(auth).__name__!r}: return a user, a model instance or a string "
        f"from authenticate(), give the result an {PRINCIPAL_ATTRIBUTE!r} attribute, "
        f"or pass scope= to idempotent()."
    )


def _keyed(prefix: str, credential: str | bytes) -> str:
    """``prefix`` and the HMAC of ``credential`` under ``SECRET_KEY``."""
    return prefix + credential_digests(credential)[0]


def secret_prefix(authenticated_by: Any) -> str:
    """``secret:`` and the auth class (or function) that returned a string, then a colon."""
    if authenticated_by is None:
        return SECRET_PREFIX  # unknown: what auth_principal(auth) alone can name
    named = authenticated_by if inspect.isroutine(authenticated_by) else type(authenticated_by)
    return f"{SECRET_PREFIX}{named.__module__}.{named.__qualname__}:"
