"""Lazy responses and class-based views, through the middleware and under ``@idempotent``.

A ``TemplateResponse`` renders after its view has returned; what is stored and
replayed is the rendered page. A ``FormView`` answers an invalid form with the
form again (200) and a valid one with a redirect.
"""

from __future__ import annotations

import pytest
from django.test import Client

from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

SLOT = {"slot": "2026-07-30T09:00", "customer": "Alice"}
TEMPLATE_VIEWS = [
    pytest.param("/real/template/", id="middleware"),
    pytest.param("/real/decorated-template/", id="idempotent"),
]
FORM_VIEWS = [
    pytest.param("/real/form-view/", id="middleware"),
    pytest.param("/real/decorated-form-view/", id="idempotent"),
]


def keyed_post(client: Client, url: str, data: dict[str, str], key: str):  # type: ignore[no-untyped-def]
    return client.post(url, data, headers={"Idempotency-Key": key})


@pytest.mark.parametrize("url", TEMPLATE_VIEWS)
def test_template_response_is_rendered_stored_and_replayed(alice_client: Client, url: str) -> None:
    first = keyed_post(alice_client, url, SLOT, "template-1")
    retry = keyed_post(alice_client, url, SLOT, "template-1")
    assert first.status_code == 201
    assert b"<h1>Booked 2026-07-30T09:00 (booking #" in first.content
    assert retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("url", FORM_VIEWS)
def test_form_view_answers_an_invalid_form_as_it_does_without_a_key(
    alice_client: Client, url: str
) -> None:
    invalid = {"slot": "2026-07-30T09:00"}  # no customer
    unkeyed = alice_client.post(url, invalid)
    keyed = keyed_post(alice_client, url, invalid, "invalid-1")
    assert unkeyed.status_code == keyed.status_code == 200
    assert b"This field is required." in keyed.content
    assert Booking.objects.count() == 0


@pytest.mark.parametrize("url", FORM_VIEWS)
def test_form_view_redirect_is_stored_and_replayed(alice_client: Client, url: str) -> None:
    first = keyed_post(alice_client, url, SLOT, "valid-1")
    retry = keyed_post(alice_client, url, SLOT, "valid-1")
    booking = Booking.objects.get()
    assert first.status_code == retry.status_code == 302
    assert first["Location"] == retry["Location"] == f"/real/bookings/{booking.pk}/"
    assert retry["Idempotency-Replayed"] == "true"
