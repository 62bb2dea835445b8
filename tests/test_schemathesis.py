"""Property-based requests, generated from the OpenAPI schema, against a live test server.

The schema is the one :class:`idempotency_django.openapi.IdempotentAutoSchema`
documents, so schemathesis generates ``Idempotency-Key`` values from the
documented header (pattern, length) and bodies from the serializer, and in
negative mode values that violate them. Every answer must be below 500, a key
is refused exactly when the library's parser refuses it, and a keyed success
repeated unchanged must replay.
Only the ``live_server`` (127.0.0.1) is ever called.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import django.contrib.admin
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import override_settings

pytest.importorskip("drf_spectacular")
pytest.importorskip("schemathesis")

import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis import GenerationMode

from idempotency_django.protocol.keys import InvalidKey, parse_key
from tests.test_openapi import schema_class_setting

MAX_EXAMPLES = 25
OPERATIONS = [("/api/bookings/", "POST"), ("/api/book/", "POST")]


def api_schema() -> dict[str, Any]:
    with schema_class_setting():
        raw: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    # The test project's @api_view has no serializer drf-spectacular can see; it
    # validates its body with the bookings serializer, so document that body.
    book = raw["paths"]["/api/book/"]["post"]
    book.setdefault(
        "requestBody", copy.deepcopy(raw["paths"]["/api/bookings/"]["post"]["requestBody"])
    )
    return raw


def header(response: Any, name: str) -> str | None:
    values = {key.lower(): value for key, value in response.headers.items()}.get(name.lower())
    return values[0] if values else None


@pytest.fixture(scope="session")
def live_server_static() -> Iterator[None]:
    """A STATIC_URL for the session-scoped live server, which fails every request without.

    Django's live server wraps the project in a static files handler that
    parses STATIC_URL; tests/settings.py has none. Same override as the admin
    browser test's ``admin_static`` (whichever starts the server first wins,
    and both serve the admin's static files), so listed before ``live_server``.
    """
    if settings.STATIC_URL:
        yield
        return
    root = Path(django.contrib.admin.__file__).parent / "static"
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(root)):
        yield


@pytest.fixture
def basic_auth(transactional_db: None) -> str:
    User.objects.create_user("fuzz", password="fuzz-password")
    return "Basic " + base64.b64encode(b"fuzz:fuzz-password").decode()


def problem_code(response: Any) -> str | None:
    if header(response, "Content-Type") != "application/problem+json":
        return None
    code: str = json.loads(response.content)["code"]
    return code


def key_is_valid(raw: str) -> bool:
    try:
        parse_key(raw)
    except InvalidKey:
        return False
    return True


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_generated_requests_never_fail_on_the_server(
    live_server_static: None,
    live_server: Any,
    basic_auth: str,
    path: str,
    method: str,
    mode: GenerationMode,
) -> None:
    """Positive: schema-valid requests. Negative: schema-violating ones (bad keys, bodies)."""
    # The live server listens on localhost (IPv4): call it by address, nothing else.
    base_url = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    schema = schemathesis.openapi.from_dict(api_schema())
    operation = schema[path][method]
    key_parameter = next(p for p in operation.definition.raw["parameters"] if p["in"] == "header")
    assert key_parameter["name"] == "Idempotency-Key"

    statuses: list[int] = []
    keyed_successes = 0

    @hypothesis_settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        nonlocal keyed_successes
        # Authenticate as the created user, whatever security the case generated.
        case.headers = {
            name: value
            for name, value in (case.headers or {}).items()
            if name.lower() != "authorization"
        }
        case.headers["Authorization"] = basic_auth
        case.cookies = {}
        case.query = {}  # the test views read controls (?status=, ?raise=) from the query
        response = case.call(base_url=base_url, timeout=10)
        statuses.append(response.status_code)
        assert response.status_code < 500, (response.status_code, response.text[:500])
        key = case.headers.get("Idempotency-Key")
        if key is not None:
            # The server parses the key exactly as the library's parser does.
            rejected = problem_code(response) == "idempotency_key_invalid"
            assert rejected is not key_is_valid(key), (key, response.status_code)
        if key is not None and 200 <= response.status_code < 300:
            keyed_successes += 1
            again = case.call(base_url=base_url, timeout=10)
            if case.media_type == "multipart/form-data" and again.status_code == 409:
                # Known limitation: the fingerprint covers the raw body, and each
                # encoding of a multipart body has a new random boundary, so a
                # re-encoded (not resent) multipart retry is a different request.
                assert json.loads(again.content)["code"] == "idempotency_key_reused"
                return
            assert again.status_code == response.status_code
            assert header(again, "Idempotency-Replayed") == "true"
            assert again.content == response.content

    check()
    assert statuses
    if mode is GenerationMode.POSITIVE:
        assert keyed_successes > 0, statuses
