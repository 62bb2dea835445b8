"""idempotency_django.graphql with Django's test client: the key, the scope, the answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import AsyncClient, Client, override_settings

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import get_store
from tests.redis_helpers import DOWN_ALIAS, caches_with
from tests.testapp.models import Booking

pytest.importorskip("strawberry")

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.graphql_server.urls")]

BOOK = """
mutation Book($key: String, $slot: String!, $fail: Boolean! = false) {
  book(idempotencyKey: $key, slot: {name: $slot, size: LARGE}, fail: $fail) {
    id customer price tags slot { name size }
  }
}
"""


def graphql(
    client: Client, query: str, path: str = "/graphql/", **variables: Any
) -> dict[str, Any]:
    headers = variables.pop("headers", {})
    response = client.post(
        path,
        json.dumps({"query": query, "variables": variables}),
        content_type="application/json",
        headers=headers,
    )
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def codes(answer: dict[str, Any]) -> list[str]:
    return [error["extensions"]["code"] for error in answer.get("errors", [])]


def test_a_retry_replays_the_stored_result_even_for_other_fields(alice_client: Client) -> None:
    first = graphql(alice_client, BOOK, key="k1", slot="09:00")
    assert "errors" not in first, first
    booked = first["data"]["book"]
    assert booked["slot"] == {"name": "09:00", "size": "LARGE"}
    # The retry asks for other fields (one computed by a resolver of the type), aliased.
    other = 'mutation { again: book(idempotencyKey: "k1", slot: {name: "09:00", size: LARGE})'
    other += " { id label price } }"
    again = graphql(alice_client, other)
    assert again["data"]["again"] == {
        "id": booked["id"],
        "label": f"09:00 for {booked['customer']}",
        "price": "12.50",
    }
    assert Booking.objects.count() == 1


def test_the_same_key_with_other_arguments_is_refused(alice_client: Client) -> None:
    graphql(alice_client, BOOK, key="k2", slot="09:00")
    reused = graphql(alice_client, BOOK, key="k2", slot="10:00")
    assert codes(reused) == ["idempotency_key_reused"]
    assert reused["data"] is None
    assert Booking.objects.count() == 1


def test_an_invalid_key_runs_nothing(alice_client: Client) -> None:
    answer = graphql(alice_client, BOOK, key="x" * 256, slot="09:00")
    assert codes(answer) == ["idempotency_key_invalid"]
    assert Booking.objects.count() == 0


def test_two_users_never_share_an_answer(alice_client: Client, bob_client: Client) -> None:
    alices = graphql(alice_client, BOOK, key="same", slot="09:00")["data"]["book"]
    bobs = graphql(bob_client, BOOK, key="same", slot="09:00")["data"]["book"]
    assert alices["id"] != bobs["id"]
    assert graphql(bob_client, BOOK, key="same", slot="09:00")["data"]["book"] == bobs
    assert Booking.objects.count() == 2


TWO = """
mutation Two($fail: Boolean!) {
  first: book(idempotencyKey: "one", slot: {name: "a"}) { id }
  second: book(idempotencyKey: "two", slot: {name: "b"}, fail: $fail) { id }
}
"""


def test_two_mutations_two_keys_and_one_failure_stores_only_the_other(
    alice_client: Client, atomic_requests: None
) -> None:
    """Under ATOMIC_REQUESTS each mutation runs in a savepoint: the failed one's
    write goes back, its key is free; the other's work and answer stay."""
    failed = graphql(alice_client, TWO, fail=True)
    assert failed["data"] is None or failed["data"]["second"] is None
    assert [error["path"] for error in failed["errors"]] == [["second"]]
    assert list(Booking.objects.values_list("slot", flat=True)) == ["a"]
    retried = graphql(alice_client, TWO, fail=False)
    assert "errors" not in retried, retried
    assert retried["data"]["first"]["id"] == Booking.objects.get(slot="a").pk  # replayed
    assert sorted(Booking.objects.values_list("slot", flat=True)) == ["a", "b"]


COUNT = 'mutation { count(slot: "h") }'
COUNT_TWICE = 'mutation { a: count(slot: "h") b: count(slot: "h") }'


def test_the_header_keys_a_request_with_one_protected_mutation(alice_client: Client) -> None:
    keyed = {"Idempotency-Key": "header-key"}
    first = graphql(alice_client, COUNT, headers=keyed)
    assert graphql(alice_client, COUNT, headers=keyed) == first
    assert Booking.objects.count() == 1
    # Two protected mutations: one header cannot key both, so it keys neither.
    graphql(alice_client, COUNT_TWICE, headers=keyed)
    graphql(alice_client, COUNT_TWICE, headers=keyed)
    assert Booking.objects.count() == 5


def test_a_resolver_that_raises_gives_its_key_back(alice_client: Client) -> None:
    failed = graphql(alice_client, BOOK, key="k3", slot="09:00", fail=True)
    assert failed["errors"][0]["message"] == "the booking failed after its write"
    assert not IdempotencyRecord.objects.exists()
    assert "errors" not in graphql(alice_client, BOOK, key="k3", slot="09:00")


@pytest.fixture
def store_down() -> Iterator[None]:
    down = {"STORE": "redis", "STORE_OPTIONS": {"cache": DOWN_ALIAS}}
    with override_settings(CACHES=caches_with(), IDEMPOTENCY=down):
        get_store.cache_clear()
        yield
    get_store.cache_clear()


def test_the_store_down_is_idempotency_unavailable(alice_client: Client, store_down: None) -> None:
    answer = graphql(alice_client, BOOK, key="k4", slot="09:00")
    assert codes(answer) == ["idempotency_unavailable"]
    assert answer["errors"][0]["extensions"]["retryAfter"] >= 1
    assert Booking.objects.count() == 0


def test_anonymous_callers_follow_the_anonymous_setting(client: Client) -> None:
    graphql(client, BOOK, key="anon", slot="09:00")
    graphql(client, BOOK, key="anon", slot="09:00")
    assert Booking.objects.count() == 2  # "ignore": unprotected
    with override_settings(IDEMPOTENCY={"ANONYMOUS": "reject"}):
        answer = graphql(client, BOOK, key="anon", slot="09:00")
    assert codes(answer) == ["idempotency_authentication_required"]
    assert Booking.objects.count() == 2


ASYNC_BOOK = BOOK.replace("book(", "bookAsync(").replace("book\n", "bookAsync\n")


@pytest.mark.django_db(transaction=True)
def test_the_async_view_runs_async_and_sync_resolvers_once(alice: User) -> None:
    """An async resolver through arun; a sync one in a worker thread, off the event loop."""

    async def twice(query: str, variables: dict[str, Any]) -> list[dict[str, Any]]:
        client = AsyncClient()
        await client.aforce_login(alice)
        body = json.dumps({"query": query, "variables": variables})
        return [
            (await client.post("/async-graphql/", body, content_type="application/json")).json()
            for _ in range(2)
        ]

    answers = async_to_sync(twice)(ASYNC_BOOK, {"key": "ak", "slot": "09:00"})
    assert "errors" not in answers[0], answers[0]
    assert answers[0] == answers[1]
    counted = async_to_sync(twice)('mutation { count(slot: "s", idempotencyKey: "ck") }', {})
    assert "errors" not in counted[0], counted[0]
    assert counted[0] == counted[1]
    assert Booking.objects.count() == 2


def test_a_keyless_call_within_the_window_is_answered_once(
    alice_client: Client, bob_client: Client
) -> None:
    """Issue 39, part 2, for the GraphQL marker: no key, the same field and arguments."""
    call = 'mutation { countWindowed(slot: "w") }'
    first, again = graphql(alice_client, call), graphql(alice_client, call)
    assert again["data"] == first["data"] and "errors" not in again
    assert graphql(bob_client, call)["data"] != first["data"]  # another user's own
    assert Booking.objects.count() == 2
