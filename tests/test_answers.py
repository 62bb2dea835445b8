"""How answers look: header names, key echo, problem types, renderers, JSON:API, hooks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from rest_framework.test import APIClient

from idempotency_django.checks import check_settings
from idempotency_django.protocol.problems import render_problem
from tests.testapp.models import Booking
from tests.testapp.views import BookingViewSet

pytestmark = pytest.mark.django_db

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})


def post(  # type: ignore[no-untyped-def]
    client: Client,
    url: str = "/plain/bookings/",
    key: str | None = "k1",
    body: str = BODY,
    **extra: Any,
):
    return client.post(
        url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **extra
    )


@override_settings(IDEMPOTENCY={"MARKER_HEADERS": {"REPLAYED": "Idempotent-Replayed"}})
def test_stripe_clients_get_their_replay_header(alice_client: Client) -> None:
    post(alice_client)
    replay = post(alice_client)
    assert replay["Idempotent-Replayed"] == "true"
    assert "Idempotency-Replayed" not in replay


@override_settings(IDEMPOTENCY={"MARKER_HEADERS": {"KEY_ECHO": "Idempotency-Key"}})
def test_the_key_is_echoed_on_every_answer_to_a_keyed_request(alice_client: Client) -> None:
    first = post(alice_client, key="echo-1")
    replay = post(alice_client, key="echo-1")
    reused = post(alice_client, key="echo-1", body="{}")
    assert [r["Idempotency-Key"] for r in (first, replay, reused)] == ["echo-1"] * 3
    assert "Idempotency-Key" not in alice_client.post("/plain/bookings/", BODY, "application/json")


def typed_problem(
    request: HttpRequest | None, members: dict[str, Any], headers: dict[str, str]
) -> HttpResponse:
    """A PROBLEM_RENDERER whose problem types link to the project's docs (docs/errors.md)."""
    members = {**members, "type": f"https://docs.example.com/errors#{members['code']}"}
    return render_problem(request, members, headers)


@override_settings(IDEMPOTENCY={"PROBLEM_RENDERER": "tests.test_answers.typed_problem"})
def test_problem_types_link_to_the_projects_docs(alice_client: Client) -> None:
    post(alice_client)
    reused = post(alice_client, body="{}").json()
    assert reused["type"] == "https://docs.example.com/errors#idempotency_key_reused"
    assert reused["code"] == "idempotency_key_reused"


def test_json_api_clients_get_json_api_errors(alice_client: Client) -> None:
    post(alice_client)
    reused = post(alice_client, body="{}", HTTP_ACCEPT="application/vnd.api+json")
    assert reused.status_code == 409
    assert reused["Content-Type"] == "application/vnd.api+json"
    assert reused.json() == {
        "errors": [
            {
                "status": "409",
                "code": "idempotency_key_reused",
                "title": "Conflict",
                "detail": reused.json()["errors"][0]["detail"],
            }
        ]
    }
    # The problem's extension members ride along in "meta".
    with override_settings(IDEMPOTENCY={"MAX_STORED_BODY": 10}):
        post(alice_client, key="big")
        big = post(alice_client, key="big", HTTP_ACCEPT="application/vnd.api+json")
    assert big.json()["errors"][0]["meta"] == {"original_status": 201}


def plain_text_renderer(
    request: HttpRequest, members: dict[str, Any], headers: dict[str, str]
) -> HttpResponse:
    """A project's own renderer (PROBLEM_RENDERER)."""
    response = HttpResponse(
        f"{members['code']}: {members['detail']}",
        status=members["status"],
        content_type="text/plain",
    )
    for name, value in headers.items():
        response[name] = value
    return response


@override_settings(IDEMPOTENCY={"PROBLEM_RENDERER": "tests.test_answers.plain_text_renderer"})
def test_a_projects_renderer_renders_every_refusal(alice_client: Client) -> None:
    post(alice_client)
    reused = post(alice_client, body="{}")
    assert reused.status_code == 409
    assert reused["Content-Type"] == "text/plain"
    assert reused.content.startswith(b"idempotency_key_reused: ")


def custom_exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """A project's DRF exception handler: wraps every error in its own envelope."""
    from rest_framework.views import exception_handler

    response = exception_handler(exc, context)
    if response is not None:
        response.data = {"error": response.data}
    return response


@override_settings(
    REST_FRAMEWORK={
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
        "EXCEPTION_HANDLER": "tests.test_answers.custom_exception_handler",
    },
)
def test_drf_views_can_route_refusals_through_the_exception_handler(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a project writes on its view class (StrictBookingViewSet inherits it).
    monkeypatch.setattr(BookingViewSet, "raise_idempotency_errors", True, raising=False)
    api = APIClient()
    api.force_authenticate(alice)
    post(api, "/api/bookings/", key="drf-1")
    reused = post(api, "/api/bookings/", key="drf-1", body="{}")
    assert reused.status_code == 409
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["status"] == 409  # a number, as in a problem
    missing = post(api, "/api/strict-bookings/", key=None)
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "idempotency_key_missing"


def test_a_refusal_is_raised_out_of_a_protected_method_the_handler_calls(
    alice_client: Client,
) -> None:
    """Without the mixin, ``@idempotent`` on ``charge()``, which ``post()`` calls: the 409
    is raised out of ``charge()``, so nothing after it runs (the audit row)."""

    def send(amount: int) -> Any:
        body = json.dumps({"amount": amount})
        headers = {"Idempotency-Key": "charge-1"}
        return alice_client.post(
            "/api/charge-then-audit/", body, "application/json", headers=headers
        )

    assert send(1).status_code == 201
    reused = send(2)
    assert (reused.status_code, reused.json()["code"]) == (409, "idempotency_key_reused")
    assert Booking.objects.filter(slot="audit").count() == 1


def add_a_header(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    response["X-Replayed-For"] = str(request.user)
    return response


def refuse_replays_to_inactive_users(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if getattr(request.user, "first_name", "") == "gone":
        return JsonResponse({"detail": "no longer yours"}, status=403)
    return response


def test_a_replay_hook_can_add_headers(alice_client: Client) -> None:
    with override_settings(IDEMPOTENCY={"REPLAY_HOOK": "tests.test_answers.add_a_header"}):
        post(alice_client)
        assert post(alice_client)["X-Replayed-For"] == "alice"


def test_a_replay_hook_can_veto_a_replay(alice_client: Client, alice: Any) -> None:
    hook = "tests.test_answers.refuse_replays_to_inactive_users"
    with override_settings(IDEMPOTENCY={"REPLAY_HOOK": hook}):
        post(alice_client)
        alice.first_name = "gone"
        alice.save()
        vetoed = post(alice_client)
    assert vetoed.status_code == 403
    assert Booking.objects.count() == 1  # and the view did not run again


@pytest.mark.parametrize("name", ["PROBLEM_RENDERER", "REPLAY_HOOK"])
def test_dotted_paths_are_checked(name: str) -> None:
    with override_settings(IDEMPOTENCY={name: "no.such.function"}):
        assert "idempotency_django.E009" in {m.id for m in check_settings()}
