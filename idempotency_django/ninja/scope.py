"""Whose key a django-ninja request carries: the principal ninja authenticated.

django-ninja authenticates inside its view and leaves what ``authenticate()``
returned in ``request.auth``; :func:`auth_principal` names it, and
:func:`ninja_scope` is the scope of :mod:`idempotency_django.ninja`'s operations.
"""

from __future__ import annotations

import inspect
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.http import HttpRequest

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.scope import (
    Scope,
    credential_digests,
    credential_principal,
    location_of,
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

    In this order:

    * an object with an ``idempotency_principal`` attribute (or property, or
      method): its value, as it is (make it unique among every kind of
      principal, e.g. ``"partner:42"``); empty or None for nobody;
    * a Django user (``django_auth`` returns ``request.user``, a token auth
      often the token's user): the name the middleware and DRF give it
      (:func:`idempotency_django.protocol.scope.principal_of`), so a user's keys are
      the same keys whichever way they came in;
    * a model instance (an ``ApiKey`` row, a ``Client``):
      ``app_label.model:pk``, ``app_label.model@alias:pk`` for one of
      another database than the default one;
    * a string or bytes (an ``APIKeyHeader`` or ``HttpBearer`` that returns
      the key it checked, or an organisation's name): ``secret:``, the auth
      class that returned it (``authenticated_by``, the callback), and an
      HMAC of it with ``SECRET_KEY`` (the key itself, a credential, is never
      stored, and a short one cannot be found by hashing guesses). Two auth
      classes that return the same string are two principals.

    Anything else (``True``, a number, a dict) names nobody it could be told
    apart from: :class:`~django.core.exceptions.ImproperlyConfigured` is
    raised before the key is claimed, and nothing runs.
    """
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
        alias = getattr(getattr(auth, "_state", None), "db", None) or DEFAULT_DB_ALIAS
        if alias == DEFAULT_DB_ALIAS:
            return f"{meta.label_lower}:{pk}"
        return f"{meta.label_lower}@{alias}:{pk}"
    if isinstance(auth, str | bytes):
        return secret_prefix(authenticated_by) + credential_digests(auth)[0]
    raise ImproperlyConfigured(
        f"idempotency_django.ninja cannot name the principal of the authentication "
        f"result {type(auth).__name__!r}: return a user, a model instance or a string "
        f"from authenticate(), give the result an {PRINCIPAL_ATTRIBUTE!r} attribute, "
        f"or pass scope= to idempotent()."
    )


def ninja_scope(request: HttpRequest) -> Scope | None:
    """The principal ninja authenticated (``request.auth``) and the ``X-Location-Id`` header.

    An operation without ninja authentication has no ``request.auth``: its
    scope is then the ``SCOPE_FUNCTION`` setting's (the session user, by
    default), as on a plain Django view.
    """
    if not hasattr(request, "auth"):
        scope: Scope | None = idempotency_settings.SCOPE_FUNCTION(request)
        return scope
    auth = request.auth
    principal: str | None
    if isinstance(auth, str | bytes):
        # Under SECRET_KEY, or a fallback's name that still holds the key.
        via = getattr(request, AUTHENTICATED_BY_ATTRIBUTE, None)
        principal = credential_principal(request, secret_prefix(via), auth)
    else:
        principal = auth_principal(auth)
    if principal is None:
        return None
    return Scope(principal=principal, location=location_of(request))


def secret_prefix(authenticated_by: Any) -> str:
    """``secret:`` and the auth class (or function) that returned a string, then a colon."""
    if authenticated_by is None:
        return SECRET_PREFIX  # unknown: what auth_principal(auth) alone can name
    named = authenticated_by if inspect.isroutine(authenticated_by) else type(authenticated_by)
    return f"{SECRET_PREFIX}{named.__module__}.{named.__qualname__}:"
