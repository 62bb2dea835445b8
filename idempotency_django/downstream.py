"""Keys for the calls a protected view makes to other ``Idempotency-Key`` APIs.

A view that charges a card through a payment provider must send the provider
the same key on every retry of its own request, or a retry after a lost
answer charges twice. ``downstream_key`` derives that key from the key
the request holds (its scope and the client's key) and a name the view
gives the call: the same for every attempt at the request, a takeover
included, and nothing a third party can learn the client's key from.
"""

from __future__ import annotations

import json

from django.http import HttpRequest
from django.utils.crypto import salted_hmac

from idempotency_django.marks import KEY_ATTRIBUTE, django_request
from idempotency_django.stores import RecordKey

__all__ = ["NotProtected", "downstream_key"]

#: Keeps these HMACs apart from every other use of ``SECRET_KEY`` (sessions, signing).
SALT = "idempotency_django.downstream.downstream_key"


class NotProtected(RuntimeError):
    """``downstream_key`` was called for a request that holds no key.

    Only a request the library claimed a key for has one: not a request
    without ``Idempotency-Key``, an anonymous one let through
    (``ANONYMOUS = "ignore"``), or a view nothing protects.
    """


def downstream_key(request: HttpRequest, name: str) -> str:
    """The ``Idempotency-Key`` for the call ``name`` that this protected request makes.

    An HMAC-SHA256 (64 hexadecimal characters), keyed with a secret derived
    from ``SECRET_KEY``, of the request's scope (principal and location), its
    client's key and ``name``: the same on every retry and after a takeover,
    different for each principal, location, key and name, and revealing
    none of them. ``request`` is the one the view got (Django's, DRF's or
    ninja's). Raises [`NotProtected`][idempotency_django.downstream.NotProtected]
    when the request holds no key.
    """
    if not name:
        raise ValueError("downstream_key needs the name of the call, e.g. 'charge'.")
    key = getattr(django_request(request), KEY_ATTRIBUTE, None)
    if not isinstance(key, RecordKey):
        raise NotProtected(
            "downstream_key() is only for a request whose Idempotency-Key the library "
            "claimed: this one carries no key, or nothing protects its view, or its "
            "anonymous caller was let through unprotected. Require the key on the view "
            "(@idempotent(required=True)) to be sure there is one."
        )
    # JSON: no two lists of parts are ever the same text, whatever they contain.
    parts = json.dumps([key.principal, key.location, key.key, name])
    return salted_hmac(SALT, parts, algorithm="sha256").hexdigest()
