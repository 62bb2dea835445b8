"""The middleware lists real projects run: every other middleware behaves for a keyed
request exactly as it does for one without a key, and what is stored and replayed is
what the client first got."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import translation

from tests.real_stack.clients import browser, csrf_token_of
from tests.real_stack.middleware import (
    GZIP,
    IDEMPOTENCY,
    LOCALE,
    LOGIN_REQUIRED,
    QUEUEING,
    STARTPROJECT,
    with_middleware,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

SESSION = "django.contrib.sessions.middleware.SessionMiddleware"
AUTHENTICATION = "django.contrib.auth.middleware.AuthenticationMiddleware"
SLOT = {"slot": "2026-07-30T09:00"}


def keyed_post(client: Client, url: str, key: str, **headers: str):  # type: ignore[no-untyped-def]
    return client.post(url, SLOT, headers={"Idempotency-Key": key, **headers})


def decoded(response) -> bytes:  # type: ignore[no-untyped-def]
    """The body as the client reads it, after any Content-Encoding."""
    if response.get("Content-Encoding") == "gzip":
        return gzip.decompress(response.content)
    return bytes(response.content)


# -- LoginRequiredMiddleware, listed after the idempotency middleware --------------


def test_login_required_redirects_an_anonymous_keyed_post_to_the_login_page(
    settings: Any,
) -> None:
    settings.MIDDLEWARE = with_middleware(LOGIN_REQUIRED, after=IDEMPOTENCY)
    anonymous = Client()
    unkeyed = anonymous.post("/real/receipt/", SLOT)
    keyed = keyed_post(anonymous, "/real/receipt/", "anonymous-1")
    assert unkeyed.status_code == keyed.status_code == 302
    assert keyed["Location"] == unkeyed["Location"] == "/accounts/login/?next=/real/receipt/"
    assert Booking.objects.count() == 0


def test_login_required_lets_a_logged_in_user_book_once(settings: Any, alice: User) -> None:
    settings.MIDDLEWARE = with_middleware(LOGIN_REQUIRED, after=IDEMPOTENCY)
    client = browser("alice", "alice-password")
    token = csrf_token_of(client, "/real/form/")
    first = keyed_post(client, "/real/receipt/", "logged-in-1", **{"X-CSRFToken": token})
    retry = keyed_post(client, "/real/receipt/", "logged-in-1", **{"X-CSRFToken": token})
    assert first.status_code == retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


# -- GZipMiddleware ---------------------------------------------------------------


@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param([GZIP, *STARTPROJECT], id="gzip-first"),
        pytest.param(
            with_middleware(GZIP, after=IDEMPOTENCY),
            id="gzip-after-idempotency",
        ),
    ],
)
def test_gzip_replay_decodes_to_the_body_the_client_first_got(
    settings: Any, alice_client: Client, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    first = keyed_post(alice_client, "/real/receipt/", "gzip-1", **{"Accept-Encoding": "gzip"})
    retry = keyed_post(alice_client, "/real/receipt/", "gzip-1", **{"Accept-Encoding": "gzip"})
    assert first.status_code == retry.status_code == 201
    assert first["Content-Encoding"] == "gzip"
    assert retry["Idempotency-Replayed"] == "true"
    assert decoded(retry) == decoded(first)
    assert decoded(first).startswith(b"Receipt for booking #")
    assert Booking.objects.count() == 1


# -- LocaleMiddleware with i18n_patterns ---------------------------------------------


@pytest.fixture
def fresh_worker_thread() -> Iterator[None]:
    """No language active, as in a server thread's first request (tests share a thread)."""
    translation.deactivate()
    yield
    translation.deactivate()


@pytest.mark.usefixtures("fresh_worker_thread")
@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param(with_middleware(LOCALE, after=SESSION), id="locale-after-session"),
        pytest.param(
            with_middleware(LOCALE, after=IDEMPOTENCY),
            id="locale-last",
        ),
    ],
)
def test_a_keyed_post_to_a_language_prefixed_url_books_once(
    settings: Any, alice_client: Client, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    url = "/de/real/localized-receipt/"
    first = keyed_post(alice_client, url, "locale-1")
    retry = keyed_post(alice_client, url, "locale-1")
    assert first.status_code == retry.status_code == 201
    assert b"Language: de" in first.content
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


@pytest.mark.usefixtures("fresh_worker_thread")
@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param(with_middleware(LOCALE, after=SESSION), id="locale-after-session"),
        pytest.param(with_middleware(LOCALE, after=IDEMPOTENCY), id="locale-last"),
    ],
)
def test_a_keyed_post_to_a_translated_route_books_once(
    settings: Any, alice: User, middleware: list[str]
) -> None:
    """``path(_("real/booking/"), ...)`` is ``real/reservation/`` in French: the middleware
    must resolve it in the language LocaleMiddleware picks, even when listed before it."""
    settings.MIDDLEWARE = middleware
    client = browser("alice", "alice-password")
    token = csrf_token_of(client, "/real/form/")
    french = {"Accept-Language": "fr", "X-CSRFToken": token}
    first = keyed_post(client, "/real/reservation/", "translated-1", **french)
    retry = keyed_post(client, "/real/reservation/", "translated-1", **french)
    assert first.status_code == retry.status_code == 201
    assert b"Language: fr" in first.content
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


# -- a project's middleware with process_exception and process_template_response ------

QUEUEING_POSITIONS = [
    pytest.param(with_middleware(QUEUEING, after=AUTHENTICATION), id="before-idempotency"),
    pytest.param(with_middleware(QUEUEING, after=IDEMPOTENCY), id="after-idempotency"),
]


@pytest.mark.parametrize("middleware", QUEUEING_POSITIONS)
def test_process_exception_answers_a_keyed_request_as_an_unkeyed_one(
    settings: Any, alice_client: Client, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    unkeyed = alice_client.post("/real/queued/", SLOT)
    keyed = keyed_post(alice_client, "/real/queued/", "queued-1")
    assert unkeyed.status_code == keyed.status_code == 202
    assert keyed.content == unkeyed.content == b'{"queued": true}'


@pytest.mark.parametrize("middleware", QUEUEING_POSITIONS)
def test_the_answer_process_exception_made_is_stored_and_replayed(
    settings: Any, alice_client: Client, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    first = keyed_post(alice_client, "/real/queued/", "queued-2")
    retry = keyed_post(alice_client, "/real/queued/", "queued-2")
    assert first.status_code == retry.status_code == 202
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("middleware", QUEUEING_POSITIONS)
def test_process_template_response_shapes_the_body_that_is_stored_and_replayed(
    settings: Any, alice_client: Client, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    first = keyed_post(alice_client, "/real/template/", "template-1")
    retry = keyed_post(alice_client, "/real/template/", "template-1")
    assert first.status_code == retry.status_code == 201
    assert first["X-Served-By"] == "queueing-middleware"
    assert b"Served by the queueing middleware." in first.content
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1
