"""The key contract in a protected django-ninja operation's OpenAPI schema."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.openapi_contract import (
    KEY_SCHEMA,
    PROBLEM_SCHEMA,
    add_problem_response,
    add_replayed_header,
    key_description,
    key_required,
    problem_answers,
)
from idempotency_django.protocol.options import ViewOptions

if TYPE_CHECKING:  # django-ninja is imported by idempotency_django.ninja only
    from ninja.operation import Operation


def operation_openapi_extra(
    operation: Operation, base: dict[str, Any] | None, options: ViewOptions
) -> dict[str, Any]:
    """``base`` (the operation's own ``openapi_extra``) and the key contract, for ninja to
    merge. Read when the API is bound (``api.urls``): the schema shows the settings of then."""
    extra = copy.deepcopy(base) if base else {}
    if operation.methods and not set(operation.methods) & set(idempotency_settings.METHODS):
        return extra
    required = key_required(options.required)
    parameter = {
        "in": "header",
        "name": idempotency_settings.HEADER,
        "required": required,
        "description": key_description(required, options.fingerprint),
        "schema": dict(KEY_SCHEMA),
    }
    parameters = extra.setdefault("parameters", [])
    if not any(
        isinstance(p, dict) and p.get("in") == "header" and p.get("name") == parameter["name"]
        for p in parameters
    ):
        parameters.insert(0, parameter)
    responses = extra.setdefault("responses", {})
    documented = {status for status in operation.response_models if isinstance(status, int)}
    for status in documented:
        if 200 <= status < 300:
            add_replayed_header(responses.setdefault(status, {}))
    for answer in problem_answers(required):
        response = responses.setdefault(answer[0], {})
        if answer[0] not in documented:  # ninja's own description stays
            response.setdefault("description", answer[1])
        add_problem_response(response, answer, copy.deepcopy(PROBLEM_SCHEMA))
    return extra
