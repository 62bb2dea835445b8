"""``@idempotent`` on something that does not answer with a Django response.

0.2.0 read ``.status_code`` of whatever the view returned after the work had
run: a 500, and the key left reserved until ``LOCK_TIMEOUT``. Now the error
says what to do, and the attempt is aborted: in a transaction the work rolls
back with the reservation; without one the key is given back.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from rest_framework.authtoken.models import Token

from idempotency_django.models import IdempotencyRecord
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)


def post(client: Client, url: str, **headers: str) -> Any:
    return client.post(url, "{}", content_type="application/json", headers=headers)


def test_a_view_that_returns_no_response_rolls_back_with_its_reservation(
    alice_client: Client,
) -> None:
    with pytest.raises(TypeError, match="not a Django response"):
        post(alice_client, "/plain/no-response-atomic/", **{"Idempotency-Key": "t-1"})
    assert Booking.objects.filter(slot="tuple-atomic").count() == 0
    assert IdempotencyRecord.objects.count() == 0  # not stranded: a retry may run


def test_without_a_transaction_the_key_is_given_back_not_stranded(alice_client: Client) -> None:
    with pytest.raises(TypeError, match=r"idempotency_django\.ninja\.idempotent"):
        post(alice_client, "/plain/no-response/", **{"Idempotency-Key": "t-2"})
    assert IdempotencyRecord.objects.count() == 0


def test_the_django_decorator_on_a_ninja_operation_is_refused_before_any_claim(
    alice: User,
) -> None:
    pytest.importorskip("ninja")
    token = Token.objects.create(user=alice).key
    client = Client()
    with pytest.raises(ImproperlyConfigured, match=r"idempotency_django\.ninja\.idempotent"):
        client.post(
            "/ninja/core-decorated",
            '{"slot": "a"}',
            content_type="application/json",
            headers={"Idempotency-Key": "t-3", "Authorization": f"Bearer {token}"},
        )
    assert Booking.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0
