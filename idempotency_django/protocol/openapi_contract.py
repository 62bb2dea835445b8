"""The key contract as OpenAPI describes it, for any schema generator.

The header, the replay header and the problem answers an operation under
the protection documents. :mod:`idempotency_django.openapi` (drf-spectacular)
and :mod:`idempotency_django.ninja` (django-ninja) both read this table, so
the two integrations document the same contract. Imports no schema library.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.utils.module_loading import import_string

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol import problems
from idempotency_django.protocol.keys import MAX_KEY_LENGTH
from idempotency_django.protocol.scope import MAX_LOCATION_LENGTH

__all__ = [
    "KEY_PATTERN",
    "KEY_SCHEMA",
    "PROBLEM_SCHEMA",
    "ProblemAnswer",
    "add_problem_response",
    "key_description",
    "key_required",
    "problem_answers",
    "replayed_header",
]

#: Printable ASCII without a comma, no leading or trailing space: the bare keys
#: :func:`idempotency_django.protocol.keys.parse_key` accepts (it also accepts a quoted
#: RFC 8941 sf-string, which may contain a comma).
KEY_PATTERN = r"^[\x21-\x2B\x2D-\x7E](?:[\x20-\x2B\x2D-\x7E]*[\x21-\x2B\x2D-\x7E])?$"
#: The ``Idempotency-Key`` header's schema.
KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_LENGTH,
    "pattern": KEY_PATTERN,
}

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem details object with a stable `code` member.",
    "properties": {
        "type": {"type": "string", "description": "Problem type URI.", "example": "about:blank"},
        "title": {"type": "string", "description": "The HTTP status phrase."},
        "status": {"type": "integer", "description": "The HTTP status code."},
        "code": {"type": "string", "description": "A stable, machine-readable error code."},
        "detail": {"type": "string", "description": "What went wrong, for a human."},
    },
    "required": ["type", "title", "status", "code", "detail"],
}

RETRY_AFTER_HEADER: dict[str, Any] = {
    "schema": {"type": "integer", "minimum": 0},
    "description": "Seconds to wait before retrying with the same key.",
}

#: (status, description, [(code, detail)], headers) of one problem response.
ProblemAnswer = tuple[int, str, list[tuple[str, str]], dict[str, Any]]


def key_required(required: bool | None) -> bool:
    """Whether the key is required: the view's option, else the ``REQUIRED`` setting."""
    return idempotency_settings.REQUIRED if required is None else required


def same_request_description(fingerprint: Callable[..., str] | str | None) -> str:
    """Which parts of a request make a retry "the same request" on this endpoint."""
    function: Any = fingerprint or idempotency_settings.FINGERPRINT_FUNCTION
    if isinstance(function, str):
        function = import_string(function)
    described = getattr(function, "description", None)
    if not described:  # a function of the project's that does not say
        return ""
    return f"A retry is the same request when {described} are the same. "


def key_description(required: bool, same_request: str) -> str:
    """The ``Idempotency-Key`` parameter's description."""
    return (
        "A client-generated unique key for this operation (e.g. a UUID), sent again "
        "unchanged on every retry. The first request with a key runs; a retry with the "
        "same key and the same request gets the stored response, marked with "
        f"`{idempotency_settings.MARKER_HEADERS.replayed}: true`, without running again. "
        f"1 to {MAX_KEY_LENGTH} printable ASCII characters, "
        "no comma (or an RFC 8941 quoted string). "
        + same_request
        + (
            "Required on this endpoint."
            if required
            else "Optional: without it the request runs unprotected."
        )
    )


def replayed_header() -> dict[str, Any]:
    """The replay header, as a success response documents it."""
    return {
        "schema": {"type": "string", "enum": ["true"]},
        "description": "`true` when this is the stored response of an "
        "earlier request with the same key, replayed without running "
        "the operation again. Absent otherwise.",
    }


def problem_answers(required: bool) -> list[ProblemAnswer]:
    """(status, description, [(code, detail)], headers) for each problem response.

    Read from :data:`idempotency_django.protocol.problems.REFUSALS`, with the settings
    that change them (``REUSE_STATUS``, ``ANONYMOUS``).
    """
    settings = idempotency_settings
    refusals = problems.REFUSALS
    header = settings.HEADER

    def example(code: str, **params: Any) -> tuple[str, str]:
        return code, refusals[code].english_detail(**params)

    def headers(*codes: str) -> dict[str, Any]:
        if any(refusals[code].retry_after for code in codes):
            return {"Retry-After": copy.deepcopy(RETRY_AFTER_HEADER)}
        return {}

    bad_request = [
        example(problems.KEY_INVALID),
        example(
            problems.LOCATION_INVALID,
            header=settings.LOCATION_HEADER,
            length=MAX_LOCATION_LENGTH,
        ),
    ]
    if required:
        bad_request.insert(0, example(problems.KEY_MISSING))
    result: list[ProblemAnswer] = [
        (400, f"The {header} header is missing or invalid.", bad_request, {})
    ]
    if settings.ANONYMOUS == "reject":
        refusal = example(problems.AUTHENTICATION_REQUIRED)
        result.append((401, refusal[1], [refusal], {}))
    reused, in_progress = example(problems.KEY_REUSED), example(problems.KEY_IN_PROGRESS)
    reuse_status = refusals[problems.KEY_REUSED].status_code()
    if reuse_status == 409:
        description = (
            "The key was used with a different request, or a request with this "
            "key is still being processed (with Retry-After)."
        )
        result.append((409, description, [reused, in_progress], headers(problems.KEY_IN_PROGRESS)))
    else:
        description = "A request with this key is still being processed."
        result.append((409, description, [in_progress], headers(problems.KEY_IN_PROGRESS)))
        description = "The key was used with a different request."
        result.append((reuse_status, description, [reused], headers(problems.KEY_REUSED)))
    description = (
        "The idempotency store could not be reached; nothing was done. Retry with the same key."
    )
    result.append(
        (503, description, [example(problems.UNAVAILABLE)], headers(problems.UNAVAILABLE))
    )
    return result


def add_problem_response(
    response: dict[str, Any], answer: ProblemAnswer, schema: dict[str, Any]
) -> None:
    """Add one problem answer's content, with an example per code, and headers to ``response``.

    A response the operation documents itself (e.g. a 400 validation error)
    keeps its own content; the problem type is added.
    """
    status, _description, codes, headers = answer
    examples = {
        code: {
            "summary": code,
            "value": {
                "type": "about:blank",
                "title": HTTPStatus(status).phrase,
                "status": status,
                "code": code,
                "detail": detail,
            },
        }
        for code, detail in codes
    }
    content = response.setdefault("content", {})
    existing = content.get(problems.PROBLEM_CONTENT_TYPE)
    if existing is None:
        content[problems.PROBLEM_CONTENT_TYPE] = {"schema": schema, "examples": examples}
    elif isinstance(existing.get("examples"), dict):
        for code, example in examples.items():
            existing["examples"].setdefault(code, example)
    for name, header in headers.items():
        response.setdefault("headers", {}).setdefault(name, copy.deepcopy(header))
