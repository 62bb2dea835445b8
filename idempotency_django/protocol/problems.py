"""The answers: every refusal in one table, how a refusal is rendered, and replays.

Each refusal is an RFC 9457 problem with a stable ``code``; :data:`REFUSALS`
lists them (the webhooks' are in :mod:`~idempotency_django.webhooks`) for the
answers, the OpenAPI schema and the docs' test. A ``detail`` is translated into
the request's active language; ``code`` and ``title`` are not.
:meth:`Refusal.answer` is the one way the library refuses a request, rendered by
``PROBLEM_RENDERER`` (:func:`render_problem` by default).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext, gettext_noop

from idempotency_django.conf import FORBIDDEN_REPLAY_HEADERS, idempotency_settings
from idempotency_django.protocol.logs import log
from idempotency_django.stores import StoredResponse

PROBLEM_CONTENT_TYPE = "application/problem+json"
JSON_API_CONTENT_TYPE = "application/vnd.api+json"

#: RFC 9110's names where Python's differ by version (3.13 renamed 413's).
TITLES = {413: "Content Too Large"}

#: Set on a refusal's response: its members and ``Retry-After``, for an
#: integration that hands refusals to its framework (DRF's exception handler).
PROBLEM_ATTRIBUTE = "idempotency_problem"
STANDARD_MEMBERS = frozenset({"type", "title", "status", "code", "detail"})


@dataclass(frozen=True)
class Refusal:
    """One way of refusing a request: what clients match on, and what they read."""

    code: str
    status: int
    #: English, translated when answered; ``%(name)s`` placeholders are filled
    #: by :meth:`answer`'s ``params`` (``header`` always is).
    detail: str
    #: Whether the answer carries ``Retry-After`` (``RETRY_AFTER`` seconds).
    retry_after: bool = False

    def status_code(self) -> int:
        """``status``, or for ``idempotency_key_reused`` the ``REUSE_STATUS`` setting's."""
        return int(idempotency_settings.REUSE_STATUS) if self.code == KEY_REUSED else self.status

    def english_detail(self, **params: Any) -> str:
        """The detail as the docs and the OpenAPI schema show it."""
        return self.detail % {"header": idempotency_settings.HEADER, **params}

    def answer(
        self,
        request: HttpRequest,
        *,
        detail: str | None = None,
        retry_after: int | None = None,
        extensions: dict[str, Any] | None = None,
        **params: Any,
    ) -> HttpResponse:
        """Refuse ``request``: the problem, rendered the way the project asked for."""
        if detail is None:
            detail = gettext(self.detail) % {"header": idempotency_settings.HEADER, **params}
        if retry_after is None and self.retry_after:
            retry_after = idempotency_settings.RETRY_AFTER
        status = self.status_code()
        members = problem_members(status, self.code, detail, **(extensions or {}))
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        response: HttpResponse = idempotency_settings.PROBLEM_RENDERER(request, members, headers)
        setattr(response, PROBLEM_ATTRIBUTE, (members, retry_after))
        return response


KEY_INVALID = "idempotency_key_invalid"
KEY_MISSING = "idempotency_key_missing"
KEY_REUSED = "idempotency_key_reused"
KEY_IN_PROGRESS = "idempotency_key_in_progress"
UNAVAILABLE = "idempotency_unavailable"
LOCATION_INVALID = "idempotency_location_invalid"
BODY_UNAVAILABLE = "idempotency_body_unavailable"
AUTHENTICATION_REQUIRED = "idempotency_authentication_required"
RESPONSE_NOT_STORED = "idempotency_response_not_stored"
TOO_MANY_KEYS = "idempotency_too_many_keys"
BODY_TOO_LARGE = "idempotency_body_too_large"
BODY_INCOMPLETE = "idempotency_body_incomplete"

#: Every refusal of the key contract, by code (the webhooks' are in ``webhooks.REFUSALS``).
REFUSALS: dict[str, Refusal] = {
    refusal.code: refusal
    for refusal in (
        Refusal(KEY_MISSING, 400, gettext_noop("This endpoint requires an %(header)s header.")),
        # Answered with the parser's own detail (keys.py), which says what is wrong.
        Refusal(KEY_INVALID, 400, gettext_noop("The %(header)s header is malformed.")),
        Refusal(
            LOCATION_INVALID,
            400,
            gettext_noop("The %(header)s header must be at most %(length)d printable characters."),
        ),
        Refusal(
            BODY_UNAVAILABLE,
            400,
            gettext_noop("The request body was consumed before it could be fingerprinted."),
        ),
        Refusal(
            BODY_INCOMPLETE,
            400,
            gettext_noop("The request body ended before its Content-Length of %(length)d bytes."),
        ),
        Refusal(
            AUTHENTICATION_REQUIRED,
            401,
            gettext_noop("Requests with an %(header)s must be authenticated."),
        ),
        Refusal(
            BODY_TOO_LARGE,
            413,
            gettext_noop(
                "A request with an idempotency key may have a body of at most %(limit)d bytes."
            ),
        ),
        Refusal(
            KEY_REUSED,
            409,
            gettext_noop(
                "This idempotency key was already used with a different request. "
                "Use a new key for a new operation."
            ),
        ),
        Refusal(
            KEY_IN_PROGRESS,
            409,
            gettext_noop(
                "A request with this idempotency key is still being processed. "
                "Retry shortly to get its response."
            ),
            retry_after=True,
        ),
        Refusal(
            RESPONSE_NOT_STORED,
            409,
            gettext_noop(
                "The request with this idempotency key already ran and answered %(status)d, "
                "but its response was too large to keep for a replay. "
                "Look the result up instead of retrying."
            ),
        ),
        Refusal(
            TOO_MANY_KEYS,
            429,
            gettext_noop(
                "This principal holds %(limit)d live idempotency keys, the most it may. "
                "Retry when one has expired."
            ),
            retry_after=True,
        ),
        Refusal(
            UNAVAILABLE,
            503,
            gettext_noop(
                "The idempotency key could not be claimed; nothing was done. "
                "Retry with the same key."
            ),
            retry_after=True,
        ),
    )
}


def refuse(request: HttpRequest, code: str, **kwargs: Any) -> HttpResponse:
    """Refuse ``request`` with the refusal of ``code``: see :meth:`Refusal.answer`."""
    return REFUSALS[code].answer(request, **kwargs)


def reject(request: HttpRequest, code: str, **kwargs: Any) -> HttpResponse:
    """:func:`refuse` a keyed request before its claim, with its one INFO record
    (``rejected`` and the code): its key, its scope or its body is refused."""
    log(logging.INFO, "rejected", request, code=code)
    return refuse(request, code, **kwargs)


def problem_members(status: int, code: str, detail: str, **extensions: Any) -> dict[str, Any]:
    """The members of a problem: RFC 9457's, then ``code``, then any extensions."""
    return {
        "type": "about:blank",
        "title": TITLES.get(status) or HTTPStatus(status).phrase,
        "status": status,
        "code": code,
        "detail": str(detail),  # a lazy translation is rendered in the active language
        **extensions,
    }


def render_problem(
    request: HttpRequest | None, members: dict[str, Any], headers: dict[str, str]
) -> HttpResponse:
    """The default ``PROBLEM_RENDERER``: problem+json, or JSON:API to a client that asks.

    A renderer of the project's own takes the same arguments and must keep
    ``code``: it is what clients match on.
    """
    status = int(members["status"])
    if request is not None and JSON_API_CONTENT_TYPE in request.headers.get("Accept", ""):
        body: dict[str, Any] = {"errors": [json_api_error(members)]}
        content_type = JSON_API_CONTENT_TYPE
    else:
        body, content_type = members, PROBLEM_CONTENT_TYPE
    return HttpResponse(json.dumps(body), status=status, content_type=content_type, headers=headers)


def json_api_error(members: dict[str, Any]) -> dict[str, Any]:
    """A problem as a JSON:API error object (its status is a string there)."""
    error: dict[str, Any] = {"status": str(members["status"])}
    error.update((name, members[name]) for name in ("code", "title", "detail"))
    if members["type"] != "about:blank":
        error["links"] = {"type": members["type"]}
    if extra := {name: value for name, value in members.items() if name not in STANDARD_MEMBERS}:
        error["meta"] = extra
    return error


# -- replays ---------------------------------------------------------------------


def replay_headers(response: HttpResponse) -> tuple[tuple[str, str], ...]:
    """The headers of ``response`` that ``REPLAY_HEADERS`` keeps for its replays."""
    allowed = idempotency_settings.REPLAY_HEADERS
    kept = []
    for name, value in response.items():  # a loop: once per stored answer, no generator
        if name.upper() in allowed and name.lower() not in FORBIDDEN_REPLAY_HEADERS:
            kept.append((name, value))
    return tuple(kept)


def replay_response(stored: StoredResponse) -> HttpResponse:
    """A stored answer as it goes out again, marked by ``MARKER_HEADERS["REPLAYED"]``."""
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]  # only what the original response said
    for name, value in stored.headers:
        response[name] = value
    response[idempotency_settings.MARKER_HEADERS.replayed] = "true"
    return response
