"""The drf-spectacular schema documents the key contract on protected operations only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.schemas.inspectors import DefaultSchema
from rest_framework.schemas.openapi import AutoSchema as DRFAutoSchema

pytest.importorskip("drf_spectacular")

from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.validation import validate_schema

from idempotency_django.openapi import IdempotentAutoSchema
from idempotency_django.protocol.keys import parse_key
from idempotency_django.protocol.openapi_contract import KEY_SCHEMA

PROBLEM = "application/problem+json"

# The one setting docs/openapi.md shows, merged into the test settings below.
REST_FRAMEWORK = {
    # ... your other DRF settings ...
    "DEFAULT_SCHEMA_CLASS": "idempotency_django.openapi.IdempotentAutoSchema",
}
SCHEMA_CLASS = REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]


class MyAutoSchema(AutoSchema):
    """A project's own AutoSchema (docs/openapi.md)."""

    def get_tags(self) -> list[str]:
        return ["project"]


class ProjectAutoSchema(IdempotentAutoSchema, MyAutoSchema):
    pass


@contextmanager
def schema_class_setting(schema_class: str = SCHEMA_CLASS) -> Iterator[None]:
    """DEFAULT_SCHEMA_CLASS = IdempotentAutoSchema, for views imported before the override.

    ``@api_view`` copies ``APIView.schema`` when the view module is imported, which
    resolves DEFAULT_SCHEMA_CLASS then (a project sets it in settings, so that is
    fine). Here the test URLconf may already be imported with DRF's default: give
    those views the lazy ``DefaultSchema`` back while the schema is built.
    """
    rest_framework = {**settings.REST_FRAMEWORK, "DEFAULT_SCHEMA_CLASS": schema_class}
    patched = []
    for _path, _regex, _method, callback in EndpointEnumerator().get_api_endpoints():
        view_class = callback.cls
        if type(view_class.__dict__.get("schema")) is DRFAutoSchema:
            patched.append((view_class, view_class.__dict__["schema"]))
            view_class.schema = DefaultSchema()
    try:
        with override_settings(REST_FRAMEWORK=rest_framework):
            yield
    finally:
        for view_class, original in patched:
            view_class.schema = original


def build_schema(schema_class: str = SCHEMA_CLASS, **idempotency: Any) -> dict[str, Any]:
    with schema_class_setting(schema_class), override_settings(IDEMPOTENCY=idempotency):
        schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
        validate_schema(schema)
    return schema


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return build_schema()


def key_header(operation: dict[str, Any]) -> dict[str, Any] | None:
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "header" and parameter["name"] == "Idempotency-Key":
            return parameter  # type: ignore[no-any-return]
    return None


def problem_codes(response: dict[str, Any]) -> set[str]:
    return set(response["content"][PROBLEM]["examples"])


def test_protected_create_documents_optional_key_and_problems(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/bookings/"]["post"]
    header = key_header(operation)
    assert header is not None
    assert not header.get("required", False)
    assert header["schema"]["type"] == "string"
    assert header["schema"]["maxLength"] == 255
    assert header["description"]

    responses = operation["responses"]
    assert "Idempotency-Replayed" in responses["201"]["headers"]
    assert problem_codes(responses["400"]) == {
        "idempotency_key_invalid",
        "idempotency_location_invalid",
        "idempotency_body_unavailable",
        "idempotency_body_incomplete",
    }
    assert problem_codes(responses["409"]) == {
        "idempotency_key_reused",
        "idempotency_key_in_progress",
        "idempotency_response_not_stored",  # MAX_STORED_BODY
    }
    assert problem_codes(responses["413"]) == {"idempotency_body_too_large"}  # its default
    assert "429" not in responses  # MAX_KEYS_PER_PRINCIPAL is off
    assert "Retry-After" in responses["409"]["headers"]
    assert problem_codes(responses["503"]) == {"idempotency_unavailable"}
    assert "Retry-After" in responses["503"]["headers"]
    for status in ("400", "409", "503"):
        assert responses[status]["content"][PROBLEM]["schema"] == {
            "$ref": "#/components/schemas/IdempotencyProblem"
        }
    assert "422" not in responses


def test_problem_component(schema: dict[str, Any]) -> None:
    problem = schema["components"]["schemas"]["IdempotencyProblem"]
    assert problem["type"] == "object"
    assert set(problem["properties"]) == {"type", "title", "status", "code", "detail"}
    assert problem["properties"]["status"]["type"] == "integer"


def test_mixin_with_required_documents_required_key_and_missing(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/mixin-bookings/"]["post"]
    header = key_header(operation)
    assert header is not None
    assert header["required"] is True
    assert "idempotency_key_missing" in problem_codes(operation["responses"]["400"])


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/api/mixin-bookings/{id}/", "put"),
        ("/api/mixin-bookings/{id}/", "patch"),
        ("/api/mixin-bookings/{id}/cancel/", "post"),
    ],
)
def test_mixin_protects_every_unsafe_handler(
    schema: dict[str, Any], path: str, method: str
) -> None:
    header = key_header(schema["paths"][path][method])
    assert header is not None
    assert header["required"] is True


def test_delete_documents_replay_header_on_204(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/bookings/{id}/"]["delete"]
    assert key_header(operation) is not None
    assert "Idempotency-Replayed" in operation["responses"]["204"]["headers"]


def test_safe_methods_are_not_documented(schema: dict[str, Any]) -> None:
    for path, method in [("/api/bookings/", "get"), ("/api/bookings/{id}/", "get")]:
        operation = schema["paths"][path][method]
        assert key_header(operation) is None
        assert "409" not in operation["responses"]
        assert "headers" not in operation["responses"]["200"]


def test_unprotected_viewset_is_not_documented(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/unprotected-bookings/"]["post"]
    assert key_header(operation) is None
    assert "Idempotency-Replayed" not in operation["responses"]["201"].get("headers", {})
    for path, methods in schema["paths"].items():
        # strict is decorated on the shared base class: protected here too, as at runtime.
        if not path.startswith("/api/unprotected-bookings/") or path.endswith("/strict/"):
            continue
        for method, operation in methods.items():
            assert key_header(operation) is None, (method, path)
            assert "409" not in operation["responses"], (method, path)


def test_exempt_action_is_not_documented(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/bookings/ping/"]["post"]
    assert key_header(operation) is None
    assert "409" not in operation["responses"]
    assert "503" not in operation["responses"]


def test_action_with_its_own_options(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/bookings/strict/"]["post"]
    header = key_header(operation)
    assert header is not None
    assert header["required"] is True
    # drf-spectacular documents an @action's success as 200.
    assert "Idempotency-Replayed" in operation["responses"]["200"]["headers"]


def test_action_decorated_on_a_shared_base_is_protected_everywhere(
    schema: dict[str, Any],
) -> None:
    header = key_header(schema["paths"]["/api/unprotected-bookings/strict/"]["post"])
    assert header is not None
    assert header["required"] is True


def test_api_view_function(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/book/"]["post"]
    header = key_header(operation)
    assert header is not None
    assert not header.get("required", False)
    assert "409" in operation["responses"]


def test_webhook_receiver_is_not_key_protected(schema: dict[str, Any]) -> None:
    # @deduplicate_webhook is a separate contract, not @idempotent.
    operation = schema["paths"]["/api/hooks/{token}/"]["post"]
    assert key_header(operation) is None


def test_protected_view_without_docstring_does_not_inherit_the_mixin_doc(
    schema: dict[str, Any],
) -> None:
    for path in ("/api/bookings/", "/api/mixin-bookings/"):
        assert "IdempotentMixin" not in schema["paths"][path]["post"].get("description", "")


def test_required_setting_makes_the_key_required() -> None:
    schema = build_schema(REQUIRED=True)
    operation = schema["paths"]["/api/bookings/"]["post"]
    header = key_header(operation)
    assert header is not None
    assert header["required"] is True
    assert "idempotency_key_missing" in problem_codes(operation["responses"]["400"])
    assert key_header(schema["paths"]["/api/unprotected-bookings/"]["post"]) is None


def test_reuse_status_422() -> None:
    responses = build_schema(REUSE_STATUS=422)["paths"]["/api/bookings/"]["post"]["responses"]
    assert problem_codes(responses["422"]) == {"idempotency_key_reused"}
    assert problem_codes(responses["409"]) == {
        "idempotency_key_in_progress",
        "idempotency_response_not_stored",
    }


def test_the_limits_set_document_their_answers() -> None:
    """Each limit the settings turn on has its answer; one turned off, none."""
    schema = build_schema(
        MAX_KEYS_PER_PRINCIPAL=100, MAX_FINGERPRINTED_BODY=None, MAX_STORED_BODY=None
    )
    answers = schema["paths"]["/api/bookings/"]["post"]["responses"]
    assert problem_codes(answers["429"]) == {"idempotency_too_many_keys"}
    assert "Retry-After" in answers["429"]["headers"]
    assert "413" not in answers
    assert "idempotency_response_not_stored" not in problem_codes(answers["409"])


def test_custom_header_name() -> None:
    schema = build_schema(HEADER="X-Idempotency-Key")
    names = [p["name"] for p in schema["paths"]["/api/bookings/"]["post"]["parameters"]]
    assert "X-Idempotency-Key" in names
    assert "Idempotency-Key" not in names


def test_anonymous_reject_documents_401() -> None:
    responses = build_schema(ANONYMOUS="reject")["paths"]["/api/bookings/"]["post"]["responses"]
    assert problem_codes(responses["401"]) == {"idempotency_authentication_required"}


def test_package_imports_without_drf_spectacular() -> None:
    code = (
        "import sys; sys.modules['drf_spectacular'] = None\n"
        "import django; django.setup()\n"
        "import importlib, pkgutil, idempotency_django\n"
        "for module in pkgutil.walk_packages(idempotency_django.__path__, 'idempotency_django.'):\n"
        "    if module.name not in ('idempotency_django.openapi',):\n"
        "        importlib.import_module(module.name)\n"
        "from idempotency_django import idempotent, drf, middleware\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_extend_schema_overrides_are_kept() -> None:
    from django.urls import path
    from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
    from rest_framework import serializers
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from idempotency_django import idempotent

    class ErrorSerializer(serializers.Serializer[Any]):
        errors = serializers.DictField()  # type: ignore[assignment]  # the schema's name, not Serializer.errors

    class OutSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()

    # extend_schema picks DEFAULT_SCHEMA_CLASS when it decorates: define the view inside.
    with schema_class_setting():

        @idempotent
        class Documented(APIView):
            @extend_schema(
                parameters=[
                    OpenApiParameter(
                        "Idempotency-Key",
                        str,
                        OpenApiParameter.HEADER,
                        required=True,
                        description="Ours.",
                    )
                ],
                responses={
                    201: OutSerializer,
                    400: OpenApiResponse(ErrorSerializer, description="Validation failed."),
                },
            )
            def post(self, request: Any) -> Response:
                return Response({"id": 1}, status=201)

        schema = SchemaGenerator(patterns=[path("documented/", Documented.as_view())]).get_schema(
            request=None, public=True
        )
        validate_schema(schema)
    operation = schema["paths"]["/documented/"]["post"]
    [header] = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["description"] == "Ours."
    assert header["required"] is True
    bad_request = operation["responses"]["400"]
    assert bad_request["description"] == "Validation failed."
    assert set(bad_request["content"]) == {"application/json", PROBLEM}
    assert "Idempotency-Replayed" in operation["responses"]["201"]["headers"]
    assert "409" in operation["responses"]


def test_combined_with_a_project_auto_schema() -> None:
    schema = build_schema(f"{__name__}.ProjectAutoSchema")
    operation = schema["paths"]["/api/bookings/"]["post"]
    assert operation["tags"] == ["project"]
    assert key_header(operation) is not None
    assert "409" in operation["responses"]


@hypothesis_settings(max_examples=200, deadline=None)
@example('"a"b"').xfail(raises=AssertionError, reason="refused by the pattern itself")
@given(st.from_regex(KEY_SCHEMA["pattern"], fullmatch=True).filter(lambda key: len(key) <= 255))
def test_every_key_the_schema_admits_the_server_accepts(key: str) -> None:
    """A contract tester's key is never refused 400: no bare key may start with a quote,
    which the server reads as a quoted string to be well formed."""
    assert re.fullmatch(KEY_SCHEMA["pattern"], key)
    assert parse_key(key)
