"""Class-based views: the marks of a handler (``@idempotent``, ``@idempotency_exempt``)
decide for its method, with or without ``IdempotencyMiddleware`` and ``@idempotent`` on
the class, as they do on a DRF view's action. Through the real middleware stack."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db


def send(client: Client, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    return client.generic(
        method,
        path,
        json.dumps(body or {}),
        content_type="application/json",
        headers={"Idempotency-Key": "cbv-1"},
    )


def clicks() -> int:
    return Booking.objects.filter(slot="click").count()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("PUT", "/plain/click-counter/", id="@idempotent-class"),
        pytest.param("POST", "/async/click-counter/", id="@idempotent-async-class"),
        pytest.param("POST", "/plain/plain-click/", id="middleware-only"),
    ],
)
def test_an_exempt_handler_runs_every_time(alice_client: Client, method: str, path: str) -> None:
    """``@idempotency_exempt`` on a handler: "never protect this view or action, whatever
    the middleware or class decoration". Before, the second click was a replay."""
    first, second = send(alice_client, method, path), send(alice_client, method, path)
    assert (first.status_code, second.status_code) == (200, 200)
    assert "Idempotency-Replayed" not in second
    assert second.json() == {"clicks": 2} and clicks() == 2


@pytest.mark.parametrize("path", ["/plain/click-counter/", "/async/click-counter/"])
def test_without_the_middleware_the_class_leaves_an_exempt_handler_alone(
    settings: Any, alice_client: Client, path: str
) -> None:
    middleware = "idempotency_django.middleware.IdempotencyMiddleware"
    settings.MIDDLEWARE = [name for name in settings.MIDDLEWARE if name != middleware]
    method = "PUT" if path.startswith("/plain/") else "POST"
    send(alice_client, method, path)
    second = send(alice_client, method, path)
    assert "Idempotency-Replayed" not in second
    assert second.json() == {"clicks": 2}


def test_the_other_handlers_of_the_class_stay_protected(alice_client: Client) -> None:
    first = send(alice_client, "POST", "/plain/click-counter/")
    again = send(alice_client, "POST", "/plain/click-counter/")
    assert first.status_code == 201
    assert again.get("Idempotency-Replayed") == "true"
    assert Booking.objects.filter(slot="cbv").count() == 1


@pytest.mark.parametrize("path", ["/plain/slot-cbv/", "/plain/slot-under-class/"])
@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "no-middleware"])
def test_a_handlers_own_options_apply(
    settings: Any, alice_client: Client, path: str, middleware: bool
) -> None:
    """``@idempotent(fingerprint=json_fields("slot"))`` on ``post``: a retry that differs
    only in another field is the same request, behind the middleware and under
    ``@idempotent`` on the class. Before, the middleware (or the class) claimed the key
    with its own options first, and the retry got 409 idempotency_key_reused."""
    if not middleware:
        name = "idempotency_django.middleware.IdempotencyMiddleware"
        settings.MIDDLEWARE = [each for each in settings.MIDDLEWARE if each != name]
    first = send(alice_client, "POST", path, {"slot": "x", "sent_at": 1})
    again = send(alice_client, "POST", path, {"slot": "x", "sent_at": 2})
    assert first.status_code == 201
    assert (again.status_code, again.get("Idempotency-Replayed")) == (201, "true")
    assert Booking.objects.count() == 1


def test_an_anonymous_form_under_the_handlers_own_scope_is_protected() -> None:
    """The handler's ``@idempotent(scope=...)`` names an organisation without a login. The
    middleware readies such a form's body before Django's CSRF check parses it: it did
    for a function view, not for a class-based view's handler, whose claim then found
    the body read and answered 400 idempotency_body_unavailable."""
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = "a" * 32
    data = {"slot": "form", "csrfmiddlewaretoken": "a" * 32}  # multipart, as a browser sends
    headers = {"Idempotency-Key": "upload-1", "X-Organisation": "acme"}
    first = client.post("/plain/organisation-upload/", data, headers=headers)
    again = client.post("/plain/organisation-upload/", data, headers=headers)
    assert first.status_code == 201, first.content
    assert again.get("Idempotency-Replayed") == "true"
    assert Booking.objects.count() == 1
