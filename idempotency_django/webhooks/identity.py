"""Who a webhook delivery is: its id, and the digest of the receiver it came to.

The trigger digest stands for the receiver's route and namespace in the stored
record, so neither its URL nor its token is ever stored.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.utils.crypto import salted_hmac

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.bodies import body_chunks, body_length
from idempotency_django.protocol.keys import MAX_KEY_LENGTH, parse_key

#: Prefix of a delivery record's principal; the rest is the trigger digest.
TRIGGER_PREFIX = "webhook:"
FALLBACK_SOURCE = "fallback"
#: Seconds per bucket of the fallback hash. A retry in the next bucket is still
#: found (the buckets either side are looked up).
FALLBACK_BUCKET = 300
#: The URL keyword argument that holds a receiver's trigger token by default.
TOKEN_KWARG = "token"
# This salt and trigger_digest's name the module they were first in: another
# salt would make every delivery already accepted new again.
FALLBACK_SALT = "idempotency_django.webhooks.fallback"

#: Source names of the headers providers document as their delivery id.
PROVIDER_SOURCES = {
    "idempotency-key": "idempotency-key",
    "webhook-id": "standard-webhooks",
    "svix-id": "svix",
    "x-github-delivery": "github",
    "x-shopify-webhook-id": "shopify",
    "x-shopify-event-id": "shopify",
    "i-twilio-idempotency-token": "twilio",
}


@dataclass(frozen=True)
class DeliveryIdentity:
    delivery_id: str
    #: Where the id came from: "idempotency-key", a provider name, "body", "fallback".
    source: str


class DeliveryIdMissing(ValueError):
    """The receiver names a header as its delivery id, and the delivery has none."""


def trigger_digest(route: str, token: str, secret: str | bytes | None = None) -> str:
    """A digest of the endpoint and its token keyed with ``secret`` (``SECRET_KEY``)."""
    salt = "idempotency_django.webhooks.trigger"
    return salted_hmac(salt, f"{route}\x1f{token}", secret=secret, algorithm="sha256").hexdigest()


def delivery_identity(
    request: HttpRequest,
    namespace: str,
    *,
    id_header: str | None = None,
    body_id: Callable[[HttpRequest], str | None] | None = None,
) -> DeliveryIdentity:
    """The identity to claim: the one the receiver names, else the fallback.

    Only the identity the receiver names counts (``id_header``, else
    ``body_id``, else ``WEBHOOK_ID_HEADER``, else ``WEBHOOK_BODY_ID_FUNCTION``):
    any other header is ignored, so nobody can make a captured delivery new
    again by adding one the signature does not cover. Raises ``InvalidKey``
    for a malformed ``Idempotency-Key`` named as the id, :class:`DeliveryIdMissing`
    when the named header is absent.
    """
    if id_header is None and body_id is None:
        id_header = idempotency_settings.WEBHOOK_ID_HEADER
        body_id = None if id_header else idempotency_settings.WEBHOOK_BODY_ID_FUNCTION
    if id_header:
        value = str(request.headers.get(id_header, "")).strip()
        if not value:
            # A fallback here would let anyone re-run a captured delivery by
            # dropping the header: refuse instead.
            raise DeliveryIdMissing(f"This receiver identifies deliveries by {id_header}.")
        source = PROVIDER_SOURCES.get(id_header.lower(), "header")
        if source == "idempotency-key":
            return DeliveryIdentity(parse_key(value), source)
        return DeliveryIdentity(_storable(value), source)
    found = body_id(request) if body_id is not None else None
    if found:
        return DeliveryIdentity(_storable(str(found)), "body")
    return fallback_identity(namespace, request, int(time.time() // FALLBACK_BUCKET))


def fallback_identity(
    namespace: str, request: HttpRequest, bucket: int, secret: str | bytes | None = None
) -> DeliveryIdentity:
    """A digest of the namespace, the bucket and the raw body, keyed with ``secret``.

    Keyed (by default with ``SECRET_KEY``): a plain hash of a body with few
    possible values, shown to staff in the admin, would say which one it was to
    anyone who hashes the candidates. Raises ``RawPostDataException`` when
    something parsed the body's stream before (a multipart ``request.POST``).
    """
    mac = salted_hmac(FALLBACK_SALT, b"", secret=secret, algorithm="sha256")
    for part in (namespace.encode(), str(bucket).encode()):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    # In chunks: a body over DATA_UPLOAD_MAX_MEMORY_SIZE was copied to a file by
    # prepare_body (request.body would refuse it), and is read from there.
    mac.update(body_length(request).to_bytes(8, "big"))
    for chunk in body_chunks(request):
        mac.update(chunk)
    return DeliveryIdentity(f"{FALLBACK_SOURCE}:{bucket}:{mac.hexdigest()}", FALLBACK_SOURCE)


def _storable(delivery_id: str) -> str:
    """The id itself when it fits the key column, else its digest."""
    if len(delivery_id) <= MAX_KEY_LENGTH and delivery_id.isprintable() and delivery_id.isascii():
        return delivery_id
    return "sha256:" + hashlib.sha256(delivery_id.encode("utf-8", "surrogateescape")).hexdigest()


def kwargs_namespace(kwargs: dict[str, Any], request: HttpRequest, token_kwarg: str) -> str:
    """Every URL keyword argument, so that two tenants' receivers never share deliveries.

    A URL whose only argument is ``token_kwarg`` keeps the namespace 0.1 gave
    it (the token itself), so its accepted deliveries stay duplicates.
    """
    if set(kwargs) == {token_kwarg}:
        return _namespace_value(kwargs[token_kwarg], request)
    return "".join(
        f"\x1e{name}\x1f{_namespace_value(kwargs[name], request)}" for name in sorted(kwargs)
    )


def _namespace_value(value: Any, request: HttpRequest) -> str:
    # A path converter's object without a __str__ or __repr__ of its own has a
    # str() that holds its address, new at every request: no retry would ever be
    # a duplicate. The URL's path, which holds the argument as sent, stands for it.
    mro = type(value).__mro__[:-1]  # without object
    if any("__str__" in vars(base) or "__repr__" in vars(base) for base in mro):
        return str(value)
    return "\x1dpath\x1d" + request.path_info
