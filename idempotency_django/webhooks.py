"""Webhook delivery deduplication: a separate contract from the Idempotency-Key one.

Senders retry deliveries. Each delivery is identified by the one id its
receiver names (a header, an id read from the body, or an id its verifier
hands over), or without one by a time-bucketed hash of the receiver's
namespace and raw body, and accepted once per namespace; a duplicate gets
``202 {"status": "duplicate"}`` and the view does not run. Unlike the key
contract there is no fingerprint comparison and no replay of the stored
response: a delivery id names one event, whatever the body.

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
from typing import Any, TypedDict, TypeVar, Unpack, overload
from urllib.parse import unquote, urlsplit

from asgiref.sync import iscoroutinefunction
from django.conf import settings as django_settings
from django.core import checks
from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, get_resolver, resolve
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext, gettext_noop

from idempotency_django import problems
from idempotency_django.attempt import Attempt
from idempotency_django.conf import idempotency_settings
from idempotency_django.keys import MAX_KEY_LENGTH, InvalidKey, parse_key
from idempotency_django.logs import request_id
from idempotency_django.marks import PROTECTED_ATTRIBUTE, decide, find_request
from idempotency_django.options import ViewOptions
from idempotency_django.phases import BeginPhase, arun, run
from idempotency_django.problems import Refusal
from idempotency_django.routes import walk_patterns
from idempotency_django.stores import (
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

__all__ = [
    "DeliveryAttempt",
    "DeliveryIdMissing",
    "DeliveryIdentity",
    "RedactTriggerURLs",
    "begin_delivery",
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
FALLBACK_SALT = "idempotency_django.webhooks.fallback"
#: Set on a receiver: True when it names its namespace itself.
NAMESPACE_ATTRIBUTE = "idempotency_webhook_namespace"


@dataclass(frozen=True)
class DeliveryIdentity:
    delivery_id: str
    #: Where the id came from: "idempotency-key", a provider name, "body", "fallback".
    source: str


def trigger_digest(route: str, token: str, secret: str | bytes | None = None) -> str:
    """A keyed digest of the endpoint and its token: stored instead of either.

    Keyed with ``secret``, by default ``SECRET_KEY``.
    """
    return salted_hmac(
        "idempotency_django.webhooks.trigger",
        f"{route}\x1f{token}",
        secret=secret,
        algorithm="sha256",
    ).hexdigest()


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
ID_MISSING = "webhook_delivery_id_missing"

#: The webhooks' refusals, by code: the key contract's are in ``problems.REFUSALS``.
REFUSALS: dict[str, Refusal] = {
    refusal.code: refusal
    for refusal in (
        # Answered with the missing header's name.
        Refusal(ID_MISSING, 400, gettext_noop("This delivery has no delivery id.")),
        Refusal(
            IN_PROGRESS,
            409,
            gettext_noop("This delivery is being processed. Retry later."),
            retry_after="RETRY_AFTER",
        ),
        Refusal(
            problems.UNAVAILABLE,
            503,
            gettext_noop("The delivery could not be recorded; nothing was done. Retry later."),
            retry_after="UNAVAILABLE_RETRY_AFTER",
        ),
    )
}


class DeliveryIdMissing(ValueError):
    """The receiver names a header as its delivery id, and the delivery has none."""


def delivery_identities(
    request: HttpRequest,
    namespace: str,
    *,
    id_header: str | None = None,
    body_id: Callable[[HttpRequest], str | None] | None = None,
    now: float | None = None,
) -> tuple[DeliveryIdentity, DeliveryIdentity | None]:
    """The identity to claim, and for the fallback the previous bucket's to check.

    Only the identity the receiver names counts (``id_header``, else
    ``body_id``, else ``WEBHOOK_ID_HEADER``, else ``WEBHOOK_BODY_ID_FUNCTION``):
    any other header is ignored, so nobody can make a captured delivery new
    again by adding one the signature does not cover.

    Raises :class:`~idempotency_django.keys.InvalidKey` for a malformed
    ``Idempotency-Key`` named as the id, :class:`DeliveryIdMissing` when the
    named header is absent.
    """
    settings = idempotency_settings
    if id_header is None and body_id is None:
        id_header = settings.WEBHOOK_ID_HEADER
        body_id = None if id_header else settings.WEBHOOK_BODY_ID_FUNCTION
    if id_header:
        value = str(request.headers.get(id_header, "")).strip()
        if not value:
            # A fallback here would let anyone re-run a captured delivery by
            # dropping the header: refuse instead.
            raise DeliveryIdMissing(f"This receiver identifies deliveries by {id_header}.")
        source = PROVIDER_SOURCES.get(id_header.lower(), "header")
        if source == "idempotency-key":
            return DeliveryIdentity(parse_key(value), source), None
        return DeliveryIdentity(_storable(value), source), None
    if body_id is not None:
        found = body_id(request)
        if found:
            return DeliveryIdentity(_storable(str(found)), "body"), None
    bucket_size = settings.WEBHOOK_FALLBACK_BUCKET
    bucket = int((time.time() if now is None else now) // bucket_size)
    return (
        _fallback_identity(namespace, request, bucket),
        _fallback_identity(namespace, request, bucket - 1),
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


class WebhookOptions(TypedDict, total=False):
    """The keyword options of :func:`deduplicate_webhook`, for its typed overloads."""

    retention: int | None
    id_header: str | None
    body_id: Callable[[HttpRequest], str | None] | None
    namespace: str | Callable[[HttpRequest], str] | None
    token_kwarg: str | None


@overload
def deduplicate_webhook(view: ViewT) -> ViewT: ...


@overload
def deduplicate_webhook(
    view: None = None, **options: Unpack[WebhookOptions]
) -> Callable[[ViewT], ViewT]: ...


def deduplicate_webhook(
    view: Any = None,
    *,
    retention: int | None = None,
    id_header: str | None = None,
    body_id: Callable[[HttpRequest], str | None] | None = None,
    namespace: str | Callable[[HttpRequest], str] | None = None,
    token_kwarg: str | None = None,
) -> Any:
    """Accept each delivery to a webhook receiver view once.

    Works on a function view, below ``@api_view``, and on a view method such
    as ``post``. Name the one delivery id the receiver trusts: ``id_header``
    (a header the sender's signature covers), or ``body_id`` (a function of
    the request: an id read from the signed body, or one the verifier set on
    the request); by default ``WEBHOOK_ID_HEADER``, then
    ``WEBHOOK_BODY_ID_FUNCTION``. Every other header is ignored.

    Deliveries are deduplicated per URL pattern and all its keyword arguments
    (a tenant, a trigger token), or per ``namespace`` when given (a string,
    or a function of the request). ``retention`` defaults to
    ``WEBHOOK_RETENTION``; ``token_kwarg`` is accepted for compatibility and
    changes nothing: every keyword argument counts.
    """
    if id_header is not None and body_id is not None:
        raise TypeError("Name one delivery id: id_header or body_id, not both.")

    def decorate(func: ViewT) -> ViewT:
        def delivery_phase(kwargs: dict[str, Any]) -> BeginPhase:
            """Phase 1 for a delivery to this receiver, in the namespace of ``kwargs``."""

            def begin_phase(request: HttpRequest, _options: ViewOptions) -> Any:
                if namespace is not None:
                    space = namespace(request) if callable(namespace) else namespace
                    trigger = "\x1enamespace\x1e" + str(space)
                else:
                    trigger = _kwargs_namespace(kwargs)
                return begin_delivery(
                    request, trigger, retention=retention, body_id=body_id, id_header=id_header
                )

            return begin_phase

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await arun(
                    find_request(args),
                    ViewOptions(),
                    lambda _request: func(*args, **kwargs),
                    delivery_phase(kwargs),
                )

            wrapper: Callable[..., Any] = async_wrapper
        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return run(
                    find_request(args),
                    ViewOptions(),
                    lambda _request: func(*args, **kwargs),
                    begin_phase=delivery_phase(kwargs),
                )

        setattr(wrapper, PROTECTED_ATTRIBUTE, True)  # the middleware leaves it alone
        setattr(wrapper, RECEIVER_ATTRIBUTE, True)  # RedactTriggerURLs knows its URL is secret
        # The system check warns about a receiver whose URL gives it no namespace.
        setattr(wrapper, NAMESPACE_ATTRIBUTE, namespace is not None)
        return wrapper  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


def _kwargs_namespace(kwargs: dict[str, Any]) -> str:
    """Every URL keyword argument, so that two tenants' receivers never share deliveries.

    A URL whose only argument is ``WEBHOOK_TOKEN_KWARG`` keeps the namespace
    0.1 gave it (the token itself), so its accepted deliveries stay duplicates.
    """
    if set(kwargs) == {idempotency_settings.WEBHOOK_TOKEN_KWARG}:
        return str(next(iter(kwargs.values())))
    return "".join(f"\x1e{name}\x1f{kwargs[name]}" for name in sorted(kwargs))


def begin_delivery(
    request: HttpRequest,
    token: str,
    *,
    retention: int | None = None,
    body_id: Callable[[HttpRequest], str | None] | None = None,
    id_header: str | None = None,
) -> DeliveryAttempt | HttpResponseBase:
    """Phase 1 for a webhook delivery: a :class:`DeliveryAttempt`, or the answer to send.

    ``token`` is the receiver's namespace: its trigger token, or all its URL
    keyword arguments.
    """
    settings = idempotency_settings
    decide(request, "protected")  # by the delivery contract, whatever key it carries
    match = getattr(request, "resolver_match", None)
    route = str(match.route) if match is not None else ""
    # Deliveries accepted before a SECRET_KEY rotation were recorded under
    # the old key's digests: they are still duplicates.
    secrets = (django_settings.SECRET_KEY, *django_settings.SECRET_KEY_FALLBACKS)
    triggers = [trigger_digest(route, token, secret) for secret in secrets]
    try:
        identity, previous = delivery_identities(
            request, token, id_header=id_header, body_id=body_id
        )
    except InvalidKey as exc:
        return problems.refuse(request, problems.KEY_INVALID, detail=exc.translated(gettext))
    except DeliveryIdMissing as exc:
        return REFUSALS[ID_MISSING].answer(request, detail=str(exc))
    info = RequestInfo(
        method=str(request.method),
        path=route,  # the URL pattern, never the URL: it holds the token
        fingerprint="",
        request_id=request_id(request),
        kind="webhook",
        source=identity.source,
    )
    attempt = DeliveryAttempt(
        request,
        RecordKey(TRIGGER_PREFIX + triggers[0], "", identity.delivery_id),
        info,
        trigger=triggers[0],
        retention=settings.WEBHOOK_RETENTION if retention is None else retention,
    )
    if previous is None:
        earlier = [RecordKey(TRIGGER_PREFIX + t, "", identity.delivery_id) for t in triggers[1:]]
    else:
        # A fallback id is keyed too: under an old secret it was another id.
        bucket = int(identity.delivery_id.split(":")[1])
        earlier = [
            RecordKey(
                TRIGGER_PREFIX + trigger,
                "",
                _fallback_identity(token, request, b, secret).delivery_id,
            )
            for trigger, secret in zip(triggers, secrets, strict=True)
            for b in (bucket, bucket - 1)
            if (trigger, b) != (triggers[0], bucket)
        ]
    try:
        for key in earlier:
            held = attempt.store.peek(key)
            if held is not None:
                return attempt.held(Claim(held))
    except StoreUnavailable as exc:
        attempt.log(logging.ERROR, "unavailable", error=type(exc.__cause__ or exc).__name__)
        return attempt.unavailable()
    return attempt.claim()  # type: ignore[return-value]


class DeliveryAttempt(Attempt):
    """The key contract's phases with the delivery rules.

    Any 2xx/3xx accepts the delivery (its ``run_id``, if any, is kept, not
    the body); a 4xx or 5xx releases it, so the sender's retry runs. A
    duplicate gets ``202 {"status": "duplicate"}``, whatever its body.
    """

    def __init__(
        self,
        request: HttpRequest,
        key: RecordKey,
        info: RequestInfo,
        *,
        trigger: str,
        retention: int,
    ) -> None:
        super().__init__(request, key, info)
        self.trigger = trigger
        self.retention_seconds = retention

    def held(self, claim: Claim) -> HttpResponseBase:
        if claim.outcome is Outcome.REPLAY:
            self.log(logging.INFO, "duplicate")
            return JsonResponse({"status": "duplicate"}, status=202)
        self.log(logging.INFO, "in_progress")
        return REFUSALS[IN_PROGRESS].answer(self.request)

    def unavailable(self) -> HttpResponseBase:
        return REFUSALS[problems.UNAVAILABLE].answer(self.request)

    def principal_changed(self) -> bool:
        return False  # a delivery's principal is its receiver's namespace, not a user

    def over_key_limit(self) -> HttpResponseBase | None:
        return None  # MAX_KEYS_PER_PRINCIPAL bounds clients' keys, not a sender's deliveries

    def echo_key(self, response: HttpResponseBase) -> None:
        pass  # a delivery id is the sender's, not a key to echo

    def release_reason(self, response: HttpResponseBase) -> str | None:
        # Failed deliveries are not recorded, so the sender's retry runs.
        return f"status_{response.status_code}" if response.status_code >= 400 else None

    def stored_response(self, response: HttpResponseBase) -> StoredResponse:
        run_id = _run_id(response)
        return StoredResponse(
            status=response.status_code,
            headers=(),
            body=json.dumps({"run_id": run_id}).encode() if run_id is not None else b"",
        )

    def retention(self) -> int:
        return self.retention_seconds

    def send(self, signal: Any, **kwargs: Any) -> None:
        """Deliveries send no signals: those count the key contract's decisions."""

    def log(self, level: int, event: str, **fields: Any) -> None:
        """Never the token, the URL or the body: the trigger digest stands for them."""
        if event == "stored":
            event = "accepted"
        _log(level, event, trigger=self.trigger[:16], source=self.info.source, **fields)


class RedactTriggerURLs(logging.Filter):
    """A receiver's route in place of its URL in Django's log lines.

    A trigger token is in the receiver's URL, and Django logs URLs: each
    4xx/5xx on ``django.request`` (``"Bad Request: /hooks/<the token>/"``), a
    CSRF failure on ``django.security.csrf``, every request line of runserver
    on ``django.server``. For views decorated with :func:`deduplicate_webhook`
    this filter puts the URL pattern (``hooks/<str:token>/``) in its place;
    other URLs are left alone. The app installs it on those three loggers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            request = getattr(record, "request", None)
            if isinstance(request, HttpRequest):
                record.args = _redact_request_urls(record.args, request)
            else:
                record.args = _redact_request_line(record.args)
        return True


def _redact_request_urls(args: tuple[Any, ...], request: HttpRequest) -> tuple[Any, ...]:
    match = getattr(request, "resolver_match", None)
    if match is None:  # answered before URL resolution, by a middleware
        route = _receiver_route(request.path_info, getattr(request, "urlconf", None))
    else:
        route = str(match.route) if _is_receiver(match.func) else None
    if route is None:
        return args
    urls = {request.path, request.path_info, request.get_full_path()}
    # Django's log_response escapes its arguments (non-ASCII, backslashes).
    urls |= {url.encode("unicode_escape").decode("ascii") for url in urls}
    longest_first = sorted(urls, key=len, reverse=True)

    def redact(text: str) -> str:
        for url in longest_first:
            text = text.replace(url, route)
        return text

    return tuple(redact(arg) if isinstance(arg, str) else arg for arg in args)


def _redact_request_line(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """runserver's ``("POST /hooks/<the token>/?a=b HTTP/1.1", status, size)``."""
    words = args[0].split(" ") if isinstance(args[0], str) else []
    if len(words) < 2:
        return args
    route = _receiver_route(unquote(urlsplit(words[1]).path))
    if route is None:
        return args
    return (" ".join([words[0], route, *words[2:]]), *args[1:])


def _receiver_route(path: str, urlconf: str | None = None) -> str | None:
    """The route of the receiver at ``path``, or None when it is not one.

    A receiver's URL without its trailing slash counts: its token is real, and
    ``APPEND_SLASH`` answers it with a redirect that servers log.
    """
    for candidate in (path,) if path.endswith("/") else (path, path + "/"):
        try:
            match = resolve(candidate, urlconf)
        except Resolver404:
            continue
        return str(match.route) if _is_receiver(match.func) else None
    return None


def _is_receiver(view: Callable[..., Any]) -> bool:
    """A resolved view decorated with :func:`deduplicate_webhook`, or a class view's handler."""
    return _receiver_handler(view) is not None


def _receiver_handler(view: Callable[..., Any]) -> Any:
    """The function :func:`deduplicate_webhook` decorated behind ``view``, or None."""
    found = _marked(view)
    if found is not None:
        return found
    view_class = getattr(view, "view_class", None) or getattr(view, "cls", None)
    if view_class is None:
        return None
    names = [*getattr(view_class, "http_method_names", ()), *getattr(view, "actions", {}).values()]
    for name in names:
        found = _marked(getattr(view_class, name, None))
        if found is not None:
            return found
    return None


def _marked(handler: Any) -> Any:
    if getattr(handler, RECEIVER_ATTRIBUTE, False):
        return handler
    # @api_view keeps the decorated function only in its handler's closure.
    for cell in getattr(handler, "__closure__", None) or ():
        try:
            if getattr(cell.cell_contents, RECEIVER_ATTRIBUTE, False):
                return cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return None


@checks.register(checks.Tags.urls)
def check_receiver_namespaces(**kwargs: Any) -> list[checks.CheckMessage]:
    """A receiver whose URL has no keyword argument shares one namespace with every sender.

    Two senders (or two tenants) posting to it with the same delivery id would
    make each other's deliveries "duplicates", and the fallback identity has
    no secret token in it.
    """
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is Django's own check to report
        return []
    return [
        checks.Warning(
            f"The webhook receiver at {route!r} has no namespace: its URL has no keyword "
            "argument (a trigger token, a tenant) and it names no namespace.",
            hint="Put a trigger token in its URL (hooks/<str:token>/), or pass "
            "@deduplicate_webhook(namespace=...).",
            id="idempotency_django.W030",
        )
        for route, view, has_kwargs in walk_patterns(patterns)
        if not has_kwargs
        and (handler := _receiver_handler(view)) is not None
        and not getattr(handler, NAMESPACE_ATTRIBUTE, False)
    ]


def _fallback_identity(
    namespace: str, request: HttpRequest, bucket: int, secret: str | bytes | None = None
) -> DeliveryIdentity:
    """A keyed digest of the namespace, the bucket and the raw body.

    Keyed with ``secret`` (by default ``SECRET_KEY``): a plain hash of a body
    with few possible values, shown to staff in the admin, would say which one
    it was to anyone who hashes the candidates.
    """
    mac = salted_hmac(FALLBACK_SALT, b"", secret=secret, algorithm="sha256")
    for part in (namespace.encode(), str(bucket).encode(), request.body):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return DeliveryIdentity(f"{FALLBACK_SOURCE}:{bucket}:{mac.hexdigest()}", FALLBACK_SOURCE)


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
