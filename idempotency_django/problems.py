"""Refusals: RFC 9457 problem responses, each with a stable ``code`` member.

Their ``detail`` is translated into the request's active language (Django's i18n:
``LocaleMiddleware`` or ``translation.override``); ``code`` and ``title`` are not.

:func:`problem` is the one way the library refuses a request. The answer is
built by ``PROBLEM_RENDERER`` (by default :func:`render_problem`: problem+json,
or a JSON:API error document for a client that asks for one); on a DRF view
with ``DRF_EXCEPTION_HANDLER`` it is raised as :class:`IdempotencyError`
instead, for the project's DRF exception handler to render.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse

PROBLEM_CONTENT_TYPE = "application/problem+json"
JSON_API_CONTENT_TYPE = "application/vnd.api+json"

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

#: RFC 9110's names where Python's differ by version (3.13 renamed 413's).
TITLES = {413: "Content Too Large"}


def problem(
    request: HttpRequest,
    status: int,
    code: str,
    detail: str,
    *,
    retry_after: int | None = None,
    **extensions: Any,
) -> HttpResponse:
    """Refuse ``request``: the problem, rendered the way the project asked for."""
    from idempotency_django.conf import idempotency_settings

    settings = idempotency_settings
    members = problem_members(status, code, detail, **extensions)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if settings.DRF_EXCEPTION_HANDLER and _is_drf_request(request):
        raise idempotency_error(members, retry_after)
    response: HttpResponse = settings.PROBLEM_RENDERER(request, members, headers)
    return response


def problem_members(status: int, code: str, detail: str, **extensions: Any) -> dict[str, Any]:
    """The members of a problem: RFC 9457's, then ``code``, then any extensions."""
    from idempotency_django.conf import idempotency_settings

    base = idempotency_settings.PROBLEM_TYPE_BASE
    return {
        "type": f"{base}{code}" if base else "about:blank",
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
    response = HttpResponse(json.dumps(body), status=status, content_type=content_type)
    for name, value in headers.items():
        response[name] = value
    return response


def json_api_error(members: dict[str, Any]) -> dict[str, Any]:
    """A problem as a JSON:API error object (its status is a string there)."""
    standard = {"type", "title", "status", "code", "detail"}
    error: dict[str, Any] = {
        "status": str(members["status"]),
        "code": members["code"],
        "title": members["title"],
        "detail": members["detail"],
    }
    if members["type"] != "about:blank":
        error["links"] = {"type": members["type"]}
    extra = {name: value for name, value in members.items() if name not in standard}
    if extra:
        error["meta"] = extra
    return error


def problem_response(
    status: int, code: str, detail: str, *, retry_after: int | None = None, **extensions: Any
) -> HttpResponse:
    """The problem+json response itself, without a request to negotiate with."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return render_problem(None, problem_members(status, code, detail, **extensions), headers)


def idempotency_error(members: dict[str, Any], retry_after: int | None) -> Exception:
    """The problem as a DRF exception (DRF is only imported when it is used)."""
    from idempotency_django.drf import IdempotencyError

    return IdempotencyError(members, retry_after)


def _is_drf_request(request: Any) -> bool:
    try:
        from rest_framework.request import Request
    except ImportError:
        return False
    return isinstance(request, Request)
