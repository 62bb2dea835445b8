"""Webhook delivery deduplication: a separate contract from the Idempotency-Key one.

Each delivery is identified by the one id its receiver names, or without one by a
time-bucketed keyed hash of the receiver's namespace and raw body
(:mod:`~idempotency_django.webhooks.identity`), and accepted once per namespace; a
duplicate gets ``202 {"status": "duplicate"}`` and the view does not run. No
fingerprint, no replay: a delivery id names one event, whatever the body. The records
are the stores' own (kind "webhook"). :class:`RedactTriggerURLs` is imported here
because ``LOGGING`` configurations name it by this path.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar, Unpack, overload

from asgiref.sync import iscoroutinefunction
from django.conf import settings as django_settings
from django.http import HttpRequest, JsonResponse, RawPostDataException
from django.http.response import HttpResponseBase
from django.utils.translation import gettext, gettext_noop

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol import problems
from idempotency_django.protocol.attempt import Attempt
from idempotency_django.protocol.bodies import BodyRefused, prepare_body
from idempotency_django.protocol.keys import InvalidKey
from idempotency_django.protocol.logs import emit, error_name, request_id
from idempotency_django.protocol.marks import (
    ACTIVE_ATTRIBUTE,
    PROTECTED_ATTRIBUTE,
    decide,
    find_request,
    forget_claim,
)
from idempotency_django.protocol.options import ViewOptions, check_retention, option
from idempotency_django.protocol.phases import arun, run
from idempotency_django.protocol.problems import Refusal
from idempotency_django.protocol.transactions import transaction_block
from idempotency_django.stores import (
    Claim,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)
from idempotency_django.webhooks.identity import (
    FALLBACK_SOURCE,
    TOKEN_KWARG,
    TRIGGER_PREFIX,
    DeliveryIdentity,
    DeliveryIdMissing,
    delivery_identity,
    fallback_identity,
    kwargs_namespace,
    trigger_digest,
)
from idempotency_django.webhooks.receivers import (
    NAMESPACE_ATTRIBUTE,
    RECEIVER_ATTRIBUTE,
    RedactTriggerURLs,
)

__all__ = [
    "DeliveryAttempt",
    "DeliveryIdMissing",
    "DeliveryIdentity",
    "RedactTriggerURLs",
    "begin_delivery",
    "deduplicate_webhook",
    "delivery_identity",
    "stripe_event_id",
    "trigger_digest",
]

logger = logging.getLogger("idempotency_django.webhooks")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])

IN_PROGRESS = "webhook_delivery_in_progress"
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
            retry_after=True,
        ),
        Refusal(
            problems.UNAVAILABLE,
            503,
            gettext_noop("The delivery could not be recorded; nothing was done. Retry later."),
            retry_after=True,
        ),
    )
}


def stripe_event_id(request: HttpRequest) -> str | None:
    """Read a Stripe event's ``id`` from the body (for ``WEBHOOK_BODY_ID_FUNCTION``)."""
    try:
        event = json.loads(request.body)
    except (ValueError, RecursionError):  # not JSON, or nested too deep for the parser
        return None
    is_event = isinstance(event, dict) and event.get("object") == "event"
    event_id = event.get("id") if is_event else None
    return event_id if isinstance(event_id, str) else None


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
    ``WEBHOOK_RETENTION``. ``token_kwarg`` (by default ``"token"``) names the
    keyword argument that holds a trigger token: a URL whose only argument it
    is keeps the namespace 0.1 gave it, the token itself.
    """
    if id_header is not None and body_id is not None:
        raise TypeError("Name one delivery id: id_header or body_id, not both.")
    check_retention(retention)

    def decorate(func: ViewT) -> ViewT:
        def begin_phase(kwargs: dict[str, Any], request: HttpRequest, _: ViewOptions) -> Any:
            if namespace is None:
                space = kwargs_namespace(kwargs, request, token_kwarg or TOKEN_KWARG)
            else:
                given = namespace(request) if callable(namespace) else namespace
                space = "\x1enamespace\x1e" + str(given)
            return begin_delivery(
                request, space, retention=retention, body_id=body_id, id_header=id_header
            )

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            # Django runs no async view in a transaction: ATOMIC does not apply.
            return await arun(
                find_request(args),
                ViewOptions(),
                lambda _request: func(*args, **kwargs),
                begin_phase=functools.partial(begin_phase, kwargs),
            )

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            options = ViewOptions()
            return run(
                find_request(args),
                options,
                lambda _request: func(*args, **kwargs),
                transaction_block(options),  # ATOMIC: a refused delivery's writes go
                begin_phase=functools.partial(begin_phase, kwargs),
            )

        wrapper = async_wrapper if iscoroutinefunction(func) else sync_wrapper
        setattr(wrapper, PROTECTED_ATTRIBUTE, True)  # the middleware leaves it alone
        setattr(wrapper, RECEIVER_ATTRIBUTE, True)  # RedactTriggerURLs knows its URL is secret
        # The system check warns about a receiver whose URL gives it no namespace.
        setattr(wrapper, NAMESPACE_ATTRIBUTE, namespace is not None)
        return wrapper  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


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
    decide(request, "protected")  # by the delivery contract, whatever key it carries
    match = getattr(request, "resolver_match", None)
    route = str(match.route) if match is not None else ""  # never the URL: it holds the token
    try:
        # Whole before anything is claimed: under WSGI a sender that hung up
        # mid-body is handed what arrived, and a view that accepted that part
        # would make the sender's retry (the whole delivery) a "duplicate".
        prepare_body(request, capped=False)
        identity = delivery_identity(request, token, id_header=id_header, body_id=body_id)
    except BodyRefused as exc:
        return exc.answer(request)
    except RawPostDataException:
        # Parsed before (a verifier above read a multipart request.POST): the
        # fallback has no raw body to hash. Name an id (body_id) for it.
        return problems.refuse(request, problems.BODY_UNAVAILABLE)
    except InvalidKey as exc:
        return problems.refuse(request, problems.KEY_INVALID, detail=exc.translated(gettext))
    except DeliveryIdMissing as exc:
        return REFUSALS[ID_MISSING].answer(request, detail=str(exc))
    # Deliveries accepted before a SECRET_KEY rotation were recorded under the
    # old key's digests: they are still duplicates.
    secrets = (django_settings.SECRET_KEY, *django_settings.SECRET_KEY_FALLBACKS)
    keys = [
        RecordKey(TRIGGER_PREFIX + trigger_digest(route, token, secret), "", identity.delivery_id)
        for secret in secrets
    ]
    if identity.source == FALLBACK_SOURCE:
        # The buckets either side too: a retry a little later, or one through an
        # app server whose clock is a little behind the first's. And a fallback id
        # is keyed: under an old secret it was another id.
        bucket = int(identity.delivery_id.split(":")[1])
        keys[1:] = [
            RecordKey(key.principal, "", fallback_identity(token, request, b, secret).delivery_id)
            for key, secret in zip(list(keys), secrets, strict=True)
            for b in (bucket, bucket - 1, bucket + 1)
            if (key, b) != (keys[0], bucket)
        ]
    info = RequestInfo(
        method=str(request.method),
        path=route,
        fingerprint="",
        request_id=request_id(request),
        kind="webhook",
        source=identity.source,
    )
    # Read as RETENTION is, not through ViewOptions, which would answer every delivery
    # 500 for a setting the checks report; the receiver's retention= is checked already.
    kept_for = option(retention, idempotency_settings.WEBHOOK_RETENTION)
    attempt = DeliveryAttempt(request, keys[0], info, retention=kept_for)
    outcome = attempt.claim()
    if outcome is not attempt or len(keys) == 1:
        return outcome  # type: ignore[return-value]
    # Claimed first, then the other keys looked at: of two copies claiming two of them
    # at once (either side of a bucket's edge), each then finds the other's, and
    # neither runs unseen (both may answer 409; the sender's retry finds one kept).
    # Looked at before the claim, both could find nothing, then claim and run.
    try:
        for key in keys[1:]:
            held = attempt.store.peek(key)
            if held is not None:
                attempt.give_back("held_elsewhere")
                return attempt.held(Claim(held))
    except StoreUnavailable as exc:
        attempt.log(logging.ERROR, "unavailable", error=error_name(exc))
        attempt.give_back("unavailable")
        return attempt.unavailable()
    return attempt


class DeliveryAttempt(Attempt):
    """The key contract's phases with the delivery rules.

    Any 2xx/3xx accepts the delivery (its ``run_id``, if any, is kept, not
    the body); a 4xx or 5xx releases it, so the sender's retry runs. A
    duplicate gets ``202 {"status": "duplicate"}``, whatever its body.
    """

    #: A 4xx is not recorded either, and senders retry it: under a transaction its
    #: writes go, or each retry of a refused event would write them again.
    ROLLED_BACK_FROM = 400

    def give_back(self, reason: str) -> None:
        """Release the key this delivery claimed, before its view runs: another of its
        keys says what it gets. DEBUG: the answer's record is the request's one."""
        setattr(self.django_request, ACTIVE_ATTRIBUTE, False)
        forget_claim(self.request)
        self.release(None, reason, level=logging.DEBUG)

    def held(self, claim: Claim) -> HttpResponseBase:
        if claim.outcome is Outcome.REPLAY:
            self.log(logging.INFO, "duplicate")
            return JsonResponse({"status": "duplicate"}, status=202)
        self.log(logging.INFO, "in_progress")
        return self.in_progress()

    def in_progress(self) -> HttpResponseBase:
        # Also a delivery that lost its reservation to a retry (Settled.LOST).
        return REFUSALS[IN_PROGRESS].answer(self.request)

    def unavailable(self) -> HttpResponseBase:
        return REFUSALS[problems.UNAVAILABLE].answer(self.request)

    def over_key_limit(self) -> HttpResponseBase | None:
        return None  # MAX_KEYS_PER_PRINCIPAL bounds clients' keys, not a sender's deliveries

    def echo_key(self, response: HttpResponseBase) -> None:
        pass  # a delivery id is the sender's, not a key to echo

    def release_reason(self, response: HttpResponseBase) -> str | None:
        # Failed deliveries are not recorded, so the sender's retry runs. Its
        # principal is the receiver's namespace, never a user who could change.
        return f"status_{response.status_code}" if response.status_code >= 400 else None

    def stored_response(self, response: HttpResponseBase) -> StoredResponse:
        run_id = _run_id(response)
        body = json.dumps({"run_id": run_id}).encode() if run_id is not None else b""
        return StoredResponse(status=response.status_code, headers=(), body=body)

    def send(self, signal: Any, **kwargs: Any) -> None:
        """Deliveries send no signals: those count the key contract's decisions."""

    def log(self, level: int, event: str, **fields: Any) -> None:
        """Never the token, the URL or the body: the trigger digest stands for them."""
        if logger.isEnabledFor(level):
            fields = {
                "event": "accepted" if event == "stored" else event,
                "trigger": self.key.principal.removeprefix(TRIGGER_PREFIX)[:16],
                "source": self.info.source,
                **fields,
            }
            emit(level, fields, to=logger, prefix="webhook")


def _run_id(response: HttpResponseBase) -> str | None:
    """The ``run_id`` of a receiver's JSON answer, kept for its duplicates; None without one."""
    if hasattr(response, "data"):
        data = response.data  # a DRF Response, perhaps not rendered (or renderable) yet
    elif getattr(response, "streaming", False):
        return None
    else:
        if not getattr(response, "is_rendered", True):
            response.render()  # type: ignore[attr-defined]  # a TemplateResponse, as Attempt's
        try:
            data = json.loads(response.content or b"null")  # type: ignore[attr-defined]
        except ValueError:
            return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return None if run_id is None else str(run_id)
