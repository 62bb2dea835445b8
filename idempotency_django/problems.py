"""RFC 9457 problem responses, each with a stable ``code`` member."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from django.http import HttpResponse

PROBLEM_CONTENT_TYPE = "application/problem+json"

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


def problem_response(
    status: int, code: str, detail: str, *, retry_after: int | None = None, **extensions: Any
) -> HttpResponse:
    """``extensions`` become members of the problem, after the standard ones (RFC 9457 §3.2)."""
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "code": code,
        "detail": detail,
        **extensions,
    }
    response = HttpResponse(json.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response
