"""Signals for purges and evictions, and looking a key up from code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

import idempotency_django
from idempotency_django import signals
from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import purge_principal
from idempotency_django.stores.digests import key_digest
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(name: str):  # type: ignore[no-untyped-def]
        def receive(sender: Any, **kwargs: Any) -> None:
            seen.append((name, kwargs))

        return receive

    receivers = {name: receiver(name) for name in ("purged", "evicted")}
    for name, function in receivers.items():
        getattr(signals, name).connect(function)
    yield seen
    for name, function in receivers.items():
        getattr(signals, name).disconnect(function)


def test_a_purge_run_is_signalled(received: list[tuple[str, dict[str, Any]]]) -> None:
    IdempotencyRecordFactory.create_batch(2, expired=True)
    IdempotencyRecordFactory.create()
    call_command("purge_idempotency_records", verbosity=0)
    [(name, sent)] = received
    assert name == "purged"
    assert sent["counts"]["completed"] == 2 and sent["dry_run"] is False
    assert sent["database"] == "default"


def test_admin_evictions_and_releases_are_signalled(
    admin_client: Client, admin_user: User, received: list[tuple[str, dict[str, Any]]]
) -> None:
    done = IdempotencyRecordFactory.create(principal="auth.user:9", key="evicted-1")
    stuck = IdempotencyRecordFactory.create(in_progress=True, key="stuck-1")
    changelist = reverse("admin:idempotency_django_idempotencyrecord_changelist")
    admin_client.post(
        changelist,
        {"action": "delete_selected", "_selected_action": [done.pk], "post": "yes"},
    )
    admin_client.post(
        changelist,
        {"action": "release_reservations", "_selected_action": [stuck.pk], "post": "yes"},
    )
    assert [(name, sent["reason"]) for name, sent in received] == [
        ("evicted", "evict"),
        ("evicted", "release"),
    ]
    assert received[0][1]["key_digests"] == [key_digest("auth.user:9", "", "evicted-1")]
    assert all(sent["user"] == admin_user for _name, sent in received)
    assert not IdempotencyRecord.objects.exists()


def test_a_principal_purge_is_signalled(received: list[tuple[str, dict[str, Any]]]) -> None:
    IdempotencyRecordFactory.create_batch(3, principal="auth.user:5")
    assert purge_principal("auth.user:5") == 3
    [(name, sent)] = received
    assert (name, sent["reason"], len(sent["key_digests"])) == ("evicted", "principal", 3)


def test_lookup_from_code(alice_client: Client, alice: User) -> None:
    assert idempotency_django.lookup("book-1", user=alice) is None
    alice_client.post(
        "/plain/bookings/",
        json.dumps({"slot": "s"}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="book-1",
        HTTP_X_LOCATION_ID="portland",
    )
    state = idempotency_django.lookup("book-1", user=alice, location="portland")
    assert state is not None and (state.state, state.status) == ("completed", 201)
    assert idempotency_django.lookup("book-1", user=alice) is None  # another location
    principal = f"auth.user:{alice.pk}"
    by_principal = idempotency_django.lookup("book-1", principal=principal, location="portland")
    assert by_principal is not None and by_principal.state == "completed"
    with pytest.raises(ValueError):
        idempotency_django.lookup("book-1")
