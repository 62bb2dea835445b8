"""Keys for the calls a protected view makes to other ``Idempotency-Key`` APIs.

A view that charges a card must send the provider the same key on every retry of
its own request (or a retry after a lost answer charges twice), and another key
for any other request (or the provider takes it for the first one).
"""

from __future__ import annotations

import json

from django.http import HttpRequest
from django.utils.crypto import salted_hmac

from idempotency_django.protocol.marks import FINGERPRINT_ATTRIBUTE, KEY_ATTRIBUTE, django_request
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

    An HMAC-SHA256 (64 hexadecimal characters), keyed with a secret derived from
    ``SECRET_KEY``, of the request's scope, its client's key, its fingerprint and
    ``name``: the same on every retry and after a takeover, different for anything
    else, and revealing none of them. ``request`` is the one the view got (Django's,
    DRF's or ninja's). Raises [`NotProtected`][idempotency_django.downstream.NotProtected]
    when the request holds no key.
    """
    if not name:
        raise ValueError("downstream_key needs the name of the call, e.g. 'charge'.")
    claimed = django_request(request)
    key = getattr(claimed, KEY_ATTRIBUTE, None)
    fingerprint = getattr(claimed, FINGERPRINT_ATTRIBUTE, None)
    if not isinstance(key, RecordKey) or not isinstance(fingerprint, str):
        raise NotProtected(
            "downstream_key() is only for a request whose Idempotency-Key the library "
            "claimed: this one carries no key, or nothing protects its view, or its "
            "anonymous caller was let through unprotected. Require the key on the view "
            "(@idempotent(required=True)) to be sure there is one."
        )
    # The fingerprint: a client key used again after a 4xx gave it back (for the
    # request fixed) or past its retention (for a new request) must not make the
    # provider refuse the new parameters, or replay the first call's answer. A
    # retry is the same request: its fingerprint, and so this key, is the same.
    # JSON: no two lists of parts are ever the same text, whatever they contain.
    parts = json.dumps([key.principal, key.location, key.key, str(fingerprint), name])
    return salted_hmac(SALT, parts, algorithm="sha256").hexdigest()
