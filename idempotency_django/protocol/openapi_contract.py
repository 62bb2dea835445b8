"""The key contract as OpenAPI describes it: the header, the replay header and the problem
answers of a protected operation, for :mod:`idempotency_django.openapi` (drf-spectacular)
and :mod:`idempotency_django.ninja` alike. Imports no schema library.
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

#: The ``Idempotency-Key`` header's schema. The pattern is printable ASCII without a comma,
#: no leading or trailing space, not starting with a quote: the bare keys ``parse_key``
#: accepts (it also accepts a quoted RFC 8941 sf-string, which may contain a comma, and
#: which the pattern leaves out: one that is not well formed is refused).
KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_LENGTH,
    "pattern": r"^[\x21\x23-\x2B\x2D-\x7E](?:[\x20-\x2B\x2D-\x7E]*[\x21-\x2B\x2D-\x7E])?$",
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


def key_description(required: bool, fingerprint: Callable[..., str] | str | None) -> str:
    """The ``Idempotency-Key`` parameter's description, with which parts of a request make
    a retry "the same request" when the fingerprint function says (its ``description``)."""
    function: Any = fingerprint or idempotency_settings.FINGERPRINT_FUNCTION
    described = getattr(
        import_string(function) if isinstance(function, str) else function, "description", None
    )
    return (
        "A client-generated unique key for this operation (e.g. a UUID), sent again "
        "unchanged on every retry. The first request with a key runs; a retry with the "
        "same key and the same request gets the stored response, marked with "
        f"`{idempotency_settings.MARKER_HEADERS.replayed}: true`, without running again. "
        f"1 to {MAX_KEY_LENGTH} printable ASCII characters, "
        "no comma (or an RFC 8941 quoted string). "
        + (f"A retry is the same request when {described} are the same. " if described else "")
        + (
            "Required on this endpoint."
            if required
            else "Optional: without it the request runs unprotected."
        )
    )


def add_replayed_header(response: dict[str, Any]) -> None:
    """Document the replay header on a success response."""
    response.setdefault("headers", {}).setdefault(
        idempotency_settings.MARKER_HEADERS.replayed,
        {
            "schema": {"type": "string", "enum": ["true"]},
            "description": "`true` when this is the stored response of an "
            "earlier request with the same key, replayed without running "
            "the operation again. Absent otherwise.",
        },
    )


def problem_answers(required: bool) -> list[ProblemAnswer]:
    """Each problem response, read from :data:`~idempotency_django.protocol.problems.REFUSALS`
    with the settings that change them (``REUSE_STATUS``, ``ANONYMOUS``)."""
    missing = (problems.KEY_MISSING,) if required else ()
    settings = idempotency_settings
    invalid = (
        f"The {settings.HEADER} header is missing or invalid, or the body could not be read whole."
    )
    answers = [
        _answer(
            400,
            invalid,
            *missing,
            problems.KEY_INVALID,
            problems.LOCATION_INVALID,
            problems.BODY_UNAVAILABLE,
            problems.BODY_INCOMPLETE,
        )
    ]
    if settings.ANONYMOUS == "reject":
        rejected = problems.AUTHENTICATION_REQUIRED
        answers.append(_answer(401, _detail(rejected), rejected))
    if settings.MAX_FINGERPRINTED_BODY is not None:
        too_large = problems.BODY_TOO_LARGE
        answers.append(_answer(413, _detail(too_large), too_large))
    # Sent by the second request with a key whose first response was too large to keep.
    not_stored = (problems.RESPONSE_NOT_STORED,) if settings.MAX_STORED_BODY is not None else ()
    reuse_status = problems.REFUSALS[problems.KEY_REUSED].status_code()
    if reuse_status == 409:
        both = (
            "The key was used with a different request, or a request with this "
            "key is still being processed (with Retry-After)."
        )
        codes = (problems.KEY_REUSED, problems.KEY_IN_PROGRESS, *not_stored)
        answers.append(_answer(409, both, *codes))
    else:
        in_progress = "A request with this key is still being processed."
        answers.append(_answer(409, in_progress, problems.KEY_IN_PROGRESS, *not_stored))
        reused = "The key was used with a different request."
        answers.append(_answer(reuse_status, reused, problems.KEY_REUSED))
    if settings.MAX_KEYS_PER_PRINCIPAL:
        too_many = problems.TOO_MANY_KEYS
        answers.append(_answer(429, _detail(too_many), too_many))
    gone = "The idempotency store could not be reached; nothing was done. Retry with the same key."
    return [*answers, _answer(503, gone, problems.UNAVAILABLE)]


def _answer(status: int, description: str, *codes: str) -> ProblemAnswer:
    retry_after = any(problems.REFUSALS[code].retry_after for code in codes)
    headers = {"Retry-After": RETRY_AFTER_HEADER} if retry_after else {}
    return status, description, [(code, _detail(code)) for code in codes], headers


def _detail(code: str) -> str:
    """The code's detail as an answer would say it (its numbers from the settings, or an
    example: the Content-Length a cut body announced, the status a too large answer had)."""
    settings, refusal = idempotency_settings, problems.REFUSALS[code]
    if code == problems.LOCATION_INVALID:
        return refusal.english_detail(header=settings.LOCATION_HEADER, length=MAX_LOCATION_LENGTH)
    if code == problems.BODY_INCOMPLETE:
        return refusal.english_detail(length=1024)
    if code == problems.BODY_TOO_LARGE:
        return refusal.english_detail(limit=settings.MAX_FINGERPRINTED_BODY)
    if code == problems.RESPONSE_NOT_STORED:
        return refusal.english_detail(status=200)
    if code == problems.TOO_MANY_KEYS:
        return refusal.english_detail(limit=settings.MAX_KEYS_PER_PRINCIPAL)
    return refusal.english_detail()


def add_problem_response(
    response: dict[str, Any], answer: ProblemAnswer, schema: dict[str, Any]
) -> None:
    """Add one problem answer's content, with an example per code, and headers to ``response``.
    A response the operation documents itself (a 400 validation error) keeps its own
    content; the problem type is added."""
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
