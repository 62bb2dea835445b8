"""RETAIN_FUNCTION and the ``retain`` option: which answers are kept, asked per response.

Through the middleware, @idempotent, DRF and ninja, on the database and Redis stores.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks
from django.test import Client, override_settings

from idempotency_django.checks import check_settings, check_transactions
from tests.docs_blocks import block_defining, run_page_code
from tests.redis_helpers import redis_store_settings
from tests.testapp import downstream_views
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

KEEP_DELETES = "tests.testapp.downstream_views.keep_deletes_not_found"


@pytest.fixture(autouse=True)
def downstream_urls(settings: Any) -> Iterator[None]:
    settings.ROOT_URLCONF = "tests.downstream_urls"
    downstream_views.ASKED.clear()
    yield
    downstream_views.ASKED.clear()


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The store's settings, to merge with each test's own."""
    if request.param == "redis":
        with redis_store_settings():
            yield {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}
    else:
        yield {}


def send(client: Client, method: str, url: str, key: str) -> Any:
    return client.generic(
        method, url, b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def twice(client: Client, method: str, url: str, key: str) -> tuple[Any, Any]:
    return send(client, method, url, key), send(client, method, url, key)


def runs() -> int:
    return Booking.objects.count()


# -- RETAIN_FUNCTION, through the middleware ---------------------------------------------


def test_the_setting_keeps_a_404_for_a_delete(alice_client: Client, store: dict[str, Any]) -> None:
    """The view raised Http404; the middleware saw Django's 404 response and kept it. The
    function is told of the exception, as DRF's and ninja's doors tell it."""
    with override_settings(IDEMPOTENCY={**store, "RETAIN_FUNCTION": KEEP_DELETES}):
        first, retry = twice(alice_client, "DELETE", "/retain/plain/?missing=1", "delete-1")
    assert first.status_code == retry.status_code == 404
    assert retry["Idempotency-Replayed"] == "true"
    assert downstream_views.ASKED == [(404, "Http404")]  # asked once: the retry was a replay


def test_the_setting_decides_for_other_methods_too(
    alice_client: Client, store: dict[str, Any]
) -> None:
    with override_settings(IDEMPOTENCY={**store, "RETAIN_FUNCTION": KEEP_DELETES}):
        _, retry = twice(alice_client, "POST", "/retain/plain/?status=404", "post-404")
        _, replay = twice(alice_client, "POST", "/retain/plain/?status=201", "post-201")
    assert "Idempotency-Replayed" not in retry  # a POST's 404 is released: it ran twice
    assert replay["Idempotency-Replayed"] == "true"
    assert runs() == 3


def test_the_shipped_table_keeps_client_errors_but_not_retryable_ones(
    alice_client: Client,
) -> None:
    with override_settings(
        IDEMPOTENCY={
            "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"
        }
    ):
        _, conflict = twice(alice_client, "POST", "/retain/plain/?status=409", "post-409")
    assert "Idempotency-Replayed" not in conflict  # 409 may succeed later: released
    with override_settings(
        IDEMPOTENCY={
            "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"
        }
    ):
        _, retry = twice(alice_client, "DELETE", "/retain/plain/?missing=1", "delete-2")
    assert retry["Idempotency-Replayed"] == "true"
    _, again = twice(alice_client, "DELETE", "/retain/plain/?missing=1", "delete-3")
    assert "Idempotency-Replayed" not in again  # the default keeps 2xx/3xx only: released
    assert downstream_views.ASKED == []


# -- the retain option of @idempotent ------------------------------------------------------


def test_the_option_never_keeps_a_422_of_one_endpoint(
    alice_client: Client, store: dict[str, Any]
) -> None:
    """retain_client_errors keeps 4xx everywhere; this endpoint's 422 stays retryable."""
    with override_settings(
        IDEMPOTENCY={
            **store,
            "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors",
        }
    ):
        _, retried = twice(alice_client, "POST", "/retain/validated/?status=422", "form-1")
        _, replayed = twice(alice_client, "POST", "/retain/validated/?status=400", "form-2")
        _, elsewhere = twice(alice_client, "POST", "/retain/plain/?status=422", "form-3")
    assert "Idempotency-Replayed" not in retried
    assert replayed["Idempotency-Replayed"] == "true"
    assert elsewhere["Idempotency-Replayed"] == "true"  # the setting still rules elsewhere
    assert runs() == 4


def test_the_option_wins_over_the_setting(alice_client: Client) -> None:
    with override_settings(IDEMPOTENCY={"RETAIN_FUNCTION": KEEP_DELETES}):
        _, retry = twice(alice_client, "POST", "/retain/validated/?status=409", "form-4")
    assert retry["Idempotency-Replayed"] == "true"  # never_keep_unprocessable keeps a 409


def test_a_views_retain_client_errors_wins_over_the_setting(alice_client: Client) -> None:
    """The view's own choice before the project's: its boolean keeps the 422."""
    settings = {"RETAIN_FUNCTION": "tests.testapp.downstream_views.never_keep_unprocessable"}
    with override_settings(IDEMPOTENCY=settings):
        _, retry = twice(alice_client, "POST", "/plain/client-error/?status=422", "view-422")
    assert retry["Idempotency-Replayed"] == "true"
    assert downstream_views.ASKED == []


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_5xx_is_never_kept_whatever_the_function_says(
    alice_client: Client, store: dict[str, Any], status: int
) -> None:
    with override_settings(IDEMPOTENCY=store):
        first, retry = twice(alice_client, "POST", f"/retain/greedy/?status={status}", "boom")
    assert first.status_code == retry.status_code == status
    assert "Idempotency-Replayed" not in retry
    assert downstream_views.ASKED == []  # not even asked
    assert runs() == 2  # the retry ran the view again


def test_a_retain_function_that_raises_falls_back_to_the_default_rule(
    alice_client: Client, store: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The work is done: the 201 is kept as the default function would, and replayed."""
    broken = {**store, "RETAIN_FUNCTION": "tests.testapp.downstream_views.broken_retain"}
    with override_settings(IDEMPOTENCY=broken), caplog.at_level(logging.ERROR):
        first = send(alice_client, "POST", "/retain/plain/", "broken")
        retry = send(alice_client, "POST", "/retain/plain/", "broken")
    assert first.status_code == retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert "event=retain_failed" in caplog.text and "error=LookupError" in caplog.text


# -- DRF and ninja ---------------------------------------------------------------------------


def test_drf_keeps_the_404_it_raised_for_a_delete_and_tells_the_exception(
    alice_client: Client, store: dict[str, Any]
) -> None:
    with override_settings(IDEMPOTENCY=store):
        first, retry = twice(alice_client, "DELETE", "/retain/api/bookings/999/", "drf-delete")
    assert first.status_code == retry.status_code == 404
    assert retry["Idempotency-Replayed"] == "true"
    assert json.loads(retry.content) == json.loads(first.content)
    assert downstream_views.ASKED == [(404, "Http404")]
    assert Booking.objects.filter(slot="delete-attempt").count() == 1


def test_drf_does_not_keep_what_the_function_refuses(alice_client: Client) -> None:
    _, retry = twice(alice_client, "POST", "/retain/api/bookings/?status=404", "drf-post")
    assert "Idempotency-Replayed" not in retry
    assert downstream_views.ASKED == [(404, None), (404, None)]


def test_ninja_keeps_a_404_for_a_delete(alice_client: Client, store: dict[str, Any]) -> None:
    with override_settings(IDEMPOTENCY=store):
        first, retry = twice(alice_client, "DELETE", "/retain/ninja/bookings/999", "ninja-del")
    assert first.status_code == retry.status_code == 404
    assert retry["Idempotency-Replayed"] == "true"
    assert downstream_views.ASKED == [(404, "HttpError")]
    assert Booking.objects.filter(slot="delete-attempt").count() == 1


def test_ninja_asks_with_no_exception_for_a_returned_answer(alice_client: Client) -> None:
    _, retry = twice(alice_client, "POST", "/retain/ninja/bookings?status=404", "ninja-post")
    assert "Idempotency-Replayed" not in retry
    assert downstream_views.ASKED == [(404, None), (404, None)]


# -- the documentation's examples -----------------------------------------------------------


def test_the_settings_example_keeps_a_deletes_404(alice_client: Client) -> None:
    page = run_page_code(
        "docs/settings.md", {}, block_defining("docs/settings.md", "keep_not_found_deletes")
    )
    with override_settings(IDEMPOTENCY={"RETAIN_FUNCTION": page["keep_not_found_deletes"]}):
        _, retry = twice(alice_client, "DELETE", "/retain/plain/?missing=1", "delete-4")
        _, post = twice(alice_client, "POST", "/retain/plain/?status=404", "post-404")
    assert retry["Idempotency-Replayed"] == "true"
    assert "Idempotency-Replayed" not in post


def test_the_view_example_lets_a_client_fix_a_422_and_send_it_with_the_same_key(
    alice_client: Client,
) -> None:
    def submit(payload: dict[str, str]) -> Any:
        return alice_client.post(
            "/docs/applications/",
            json.dumps(payload),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="application-1",
        )

    with override_settings(
        IDEMPOTENCY={
            "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"
        }
    ):
        refused = submit({"name": ""})
        fixed = submit({"name": "Dana Whitfield"})
        again = submit({"name": "Dana Whitfield"})
    assert (refused.status_code, fixed.status_code) == (422, 201)
    assert again["Idempotency-Replayed"] == "true"
    assert Booking.objects.filter(slot="application").count() == 1


# -- system checks -----------------------------------------------------------------------------


def test_an_unimportable_retain_function_fails_the_checks() -> None:
    with override_settings(IDEMPOTENCY={"RETAIN_FUNCTION": "nowhere.keep"}):
        errors = check_settings()
    assert [(error.id, "RETAIN_FUNCTION" in error.msg) for error in errors] == [
        ("idempotency_django.E009", True)
    ]


def test_a_retain_function_under_drf_and_atomic_requests_is_warned_about(
    atomic_requests: None,
) -> None:
    with override_settings(IDEMPOTENCY={"RETAIN_FUNCTION": KEEP_DELETES}):
        messages = check_transactions()
    assert [message.id for message in messages if message.level == checks.WARNING] == [
        "idempotency_django.W041"
    ]
