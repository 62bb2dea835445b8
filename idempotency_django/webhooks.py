"""Webhook delivery deduplication: a separate contract from the Idempotency-Key one.

Senders retry deliveries. Each delivery is identified by a stable id
(``Idempotency-Key``, a provider header, an id read from the body, or a
time-bucketed hash of the trigger token and raw body) and accepted once per
trigger; a duplicate gets ``202 {"status": "duplicate"}`` and the view does
not run. Unlike the key contract there is no fingerprint comparison and no
replay of the stored response: a delivery id names one event, whatever the
body.

The claim, the takeover of abandoned reservations and the expiry are the
stores' own (records of kind "webhook"), so both stores serve both contracts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.crypto import salted_hmac

from idempotency_django import problems
from idempotency_django.conf import idempotency_settings
from idempotency_django.decorators import find_request
from idempotency_django.keys import MAX_KEY_LENGTH, InvalidKey, parse_key
from idempotency_django.middleware import PROTECTED_ATTRIBUTE
from idempotency_django.stores import (
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
    get_store,
)

__all__ = [
    "DeliveryIdentity",
    "RedactTriggerURLs",
    "deduplicate_webhook",
    "delivery_identities",
    "stripe_event_id",
    "trigger_digest",
]

logger = logging.getLogger("idempotency_django.webhooks")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])

#: Prefix of a delivery record's principal; the rest is the trigger digest.
TRIGGER_PREFIX = "webhook:"
IN_PROGRESS = "webhook_delivery_in_progress"
RECEIVER_ATTRIBUTE = "idempotency_webhook_receiver"
FALLBACK_SOURCE = "fallback"


@dataclass(frozen=True)
class DeliveryIdentity:
    delivery_id: str
    #: Where the id came from: "idempotency-key", a provider name, "body", "fallback".
    source: str


def trigger_digest(route: str, token: str) -> str:
    """A keyed digest of the endpoint and its token: stored instead of either."""
    return salted_hmac(
        "idempotency_django.webhooks.trigger", f"{route}\x1f{token}", algorithm="sha256"
    ).hexdigest()


def delivery_identities(
    request: HttpRequest,
    token: str,
    *,
    body_id: Callable[[HttpRequest], str | None] | None = None,
    now: float | None = None,
) -> tuple[DeliveryIdentity, DeliveryIdentity | None]:
    """The identity to claim, and for the fallback the previous bucket's to check.

    Raises :class:`~idempotency_django.keys.InvalidKey` for a malformed
    ``Idempotency-Key``.
    """
    settings = idempotency_settings
    raw_key = request.headers.get(settings.HEADER)
    if raw_key is not None:
        return DeliveryIdentity(parse_key(raw_key), "idempotency-key"), None
    for header, source in settings.WEBHOOK_ID_HEADERS:
        value = str(request.headers.get(header, "")).strip()
        if value:
            return DeliveryIdentity(_storable(value), source), None
    read_body_id = body_id or settings.WEBHOOK_BODY_ID_FUNCTION
    if read_body_id is not None:
        found = read_body_id(request)
        if found:
            return DeliveryIdentity(_storable(str(found)), "body"), None
    bucket_size = int(settings.WEBHOOK_FALLBACK_BUCKET)
    bucket = int((time.time() if now is None else now) // bucket_size)
    return (
        _fallback_identity(token, request.body, bucket),
        _fallback_identity(token, request.body, bucket - 1),
    )


def stripe_event_id(request: HttpRequest) -> str | None:
    """Read a Stripe event's ``id`` from the body (for ``WEBHOOK_BODY_ID_FUNCTION``)."""
    try:
        event = json.loads(request.body)
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("object") == "event":
        event_id = event.get("id")
        return event_id if isinstance(event_id, str) else None
    return None


def deduplicate_webhook(
    view: Any = None,
    *,
    retention: int | None = None,
    body_id: Callable[[HttpRequest], str | None] | None = None,
    token_kwarg: str | None = None,
) -> Any:
    """Accept each delivery to a webhook receiver view once.

    Works on a function view, below ``@api_view``, and on a view method such
    as ``post``. ``retention`` defaults to ``WEBHOOK_RETENTION``, ``body_id``
    to ``WEBHOOK_BODY_ID_FUNCTION``, ``token_kwarg`` to ``WEBHOOK_TOKEN_KWARG``.
    """

    def decorate(func: ViewT) -> ViewT:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = find_request(args)
            kwarg = token_kwarg or idempotency_settings.WEBHOOK_TOKEN_KWARG
            return _receive(
                request,
                str(kwargs.get(kwarg, "")),
                lambda: func(*args, **kwargs),
                retention=retention,
                body_id=body_id,
            )

        setattr(wrapper, PROTECTED_ATTRIBUTE, True)  # the middleware leaves it alone
        setattr(wrapper, RECEIVER_ATTRIBUTE, True)  # RedactTriggerURLs knows its URL is secret
        return wrapper  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


def _receive(
    request: HttpRequest,
    token: str,
    call_view: Callable[[], HttpResponseBase],
    *,
    retention: int | None,
    body_id: Callable[[HttpRequest], str | None] | None,
) -> HttpResponseBase:
    settings = idempotency_settings
    match = getattr(request, "resolver_match", None)
    route = str(match.route) if match is not None else ""
    trigger = trigger_digest(route, token)
    try:
        identity, previous = delivery_identities(request, token, body_id=body_id)
    except InvalidKey as exc:
        return problems.problem_response(400, problems.KEY_INVALID, str(exc))
    log = functools.partial(_log, trigger=trigger[:16], source=identity.source)
    store = get_store()
    key = RecordKey(TRIGGER_PREFIX + trigger, "", identity.delivery_id)
    info = RequestInfo(
        method=str(request.method),
        path=route,  # the URL pattern, never the URL: it holds the token
        fingerprint="",
        request_id=str(request.headers.get(settings.REQUEST_ID_HEADER, "")),
        kind="webhook",
        source=identity.source,
    )
    try:
        held = None
        if previous is not None:
            held = store.peek(RecordKey(TRIGGER_PREFIX + trigger, "", previous.delivery_id))
        if held is None:
            claim = store.claim(key, info, int(settings.LOCK_TIMEOUT))
            held = claim.outcome
    except StoreUnavailable as exc:
        log(logging.ERROR, "unavailable", error=type(exc.__cause__ or exc).__name__)
        return problems.problem_response(
            503,
            problems.UNAVAILABLE,
            "The delivery could not be recorded; nothing was done. Retry later.",
            retry_after=int(settings.UNAVAILABLE_RETRY_AFTER),
        )
    if held is Outcome.REPLAY:
        log(logging.INFO, "duplicate")
        return JsonResponse({"status": "duplicate"}, status=202)
    if held is not Outcome.CLAIMED:
        log(logging.INFO, "in_progress")
        return problems.problem_response(
            409,
            IN_PROGRESS,
            "This delivery is being processed. Retry later.",
            retry_after=int(settings.RETRY_AFTER),
        )

    try:
        response = call_view()
    except BaseException:
        _release(store, key, claim.token, log, reason="exception")
        raise
    if response.status_code >= 400:
        # Failed deliveries are not recorded, so the sender's retry runs.
        _release(store, key, claim.token, log, reason=f"status {response.status_code}")
        return response
    run_id = _run_id(response)
    stored = StoredResponse(
        status=response.status_code,
        headers=(),
        body=json.dumps({"run_id": run_id}).encode() if run_id is not None else b"",
    )
    keep = int(settings.WEBHOOK_RETENTION if retention is None else retention)
    try:
        store.complete(key, claim.token, stored, keep, request=info)
    except StoreUnavailable as exc:
        log(logging.ERROR, "store_failed", error=type(exc.__cause__ or exc).__name__)
    else:
        log(logging.INFO, "accepted", status=response.status_code)
    return response


class RedactTriggerURLs(logging.Filter):
    """A filter for Django's ``django.request`` logger: a receiver's route, not its URL.

    Django logs every 4xx/5xx as ``"Bad Request: /hooks/<the token>/"``; for
    views decorated with :func:`deduplicate_webhook` this puts the URL pattern
    (``hooks/<str:token>/``) in its place, so trigger tokens stay out of logs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        match = getattr(request, "resolver_match", None)
        if match is None or not getattr(match.func, RECEIVER_ATTRIBUTE, False):
            return True
        secret = {request.path, request.get_full_path()}  # type: ignore[union-attr]
        if isinstance(record.args, tuple):
            record.args = tuple(str(match.route) if arg in secret else arg for arg in record.args)
        return True


def _release(store: Any, key: RecordKey, token: str, log: Callable[..., None], reason: str) -> None:
    try:
        store.release(key, token)
    except StoreUnavailable as exc:
        log(
            logging.ERROR,
            "release_failed",
            reason=reason,
            error=type(exc.__cause__ or exc).__name__,
        )
    else:
        log(logging.INFO, "released", reason=reason)


def _fallback_identity(token: str, body: bytes, bucket: int) -> DeliveryIdentity:
    digest = hashlib.sha256()
    for part in (token.encode(), str(bucket).encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return DeliveryIdentity(f"{FALLBACK_SOURCE}:{bucket}:{digest.hexdigest()}", FALLBACK_SOURCE)


def _storable(delivery_id: str) -> str:
    """The id itself when it fits the key column, else its digest."""
    if len(delivery_id) <= MAX_KEY_LENGTH and delivery_id.isprintable() and delivery_id.isascii():
        return delivery_id
    return "sha256:" + hashlib.sha256(delivery_id.encode("utf-8", "surrogateescape")).hexdigest()


def _run_id(response: HttpResponseBase) -> str | None:
    data = getattr(response, "data", None)  # a DRF Response, before rendering
    if data is None and getattr(response, "streaming", False) is False:
        try:
            data = json.loads(getattr(response, "content", b"") or b"null")
        except ValueError:
            return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return None if run_id is None else str(run_id)


def _log(level: int, event: str, **fields: Any) -> None:
    """Never the token, the URL or the body: the trigger digest stands for them."""
    if logger.isEnabledFor(level):
        line = " ".join(f"{name}={value}" for name, value in {"event": event, **fields}.items())
        logger.log(level, "webhook %s", line, extra={"idempotency": {"event": event, **fields}})
