"""strawberry-django's mutations with the GraphQL marker: a resolver that returns a model
instance, and the generated create mutation (issue 39: "strawberry-django's mutations
work with it"). What is kept is the declared type's fields, read from the model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import path

from tests.testapp.models import Booking

pytest.importorskip("strawberry_django")

import strawberry
import strawberry_django
from strawberry.django.views import GraphQLView
from strawberry_django import mutations

from idempotency_django.decorators import idempotency_exempt
from idempotency_django.graphql import Idempotent

pytestmark = pytest.mark.django_db(transaction=True)


@strawberry_django.type(Booking)
class BookingType:
    id: strawberry.auto
    slot: strawberry.auto
    customer: strawberry.auto


@strawberry_django.input(Booking)
class BookingInput:
    slot: strawberry.auto
    customer: strawberry.auto


@strawberry.type
class Query:
    @strawberry.field
    def bookings(self) -> int:
        return Booking.objects.count()


@strawberry.type
class Mutation:
    @strawberry_django.mutation(extensions=[Idempotent()])
    def book(self, info: strawberry.Info, slot: str) -> BookingType:
        # The model itself: strawberry-django reads it through BookingType.
        return Booking.objects.create(slot=slot, owner=info.context.request.user)  # type: ignore[return-value]

    create_booking: BookingType = mutations.create(
        BookingInput, full_clean=False, extensions=[Idempotent()]
    )


urlpatterns = [
    path(
        "graphql/",
        idempotency_exempt(GraphQLView.as_view(schema=strawberry.Schema(Query, Mutation))),
    )
]


def graphql(client: Client, query: str) -> dict[str, Any]:
    response = client.post("/graphql/", json.dumps({"query": query}), "application/json")
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


@override_settings(ROOT_URLCONF=__name__)
def test_a_mutation_that_returns_a_model_instance_replays_it(
    alice_client: Client, bob_client: Client
) -> None:
    book = 'mutation { book(idempotencyKey: "k1", slot: "09:00") { id slot } }'
    first = graphql(alice_client, book)
    assert "errors" not in first, first
    # The retry asks for another field of the type: read from what was kept.
    again = graphql(alice_client, book.replace("{ id slot }", "{ id customer slot }"))
    assert again["data"]["book"] == {**first["data"]["book"], "customer": ""}
    assert graphql(bob_client, book)["data"]["book"]["id"] != first["data"]["book"]["id"]
    assert Booking.objects.count() == 2


@override_settings(ROOT_URLCONF=__name__)
def test_the_generated_create_mutation_runs_once_per_key(alice_client: Client) -> None:
    create = (
        'mutation { createBooking(idempotencyKey: "k2", data: {slot: "10:00", customer: "Dana"})'
        " { id slot customer } }"
    )
    first, again = graphql(alice_client, create), graphql(alice_client, create)
    assert "errors" not in first and again == first
    reused = graphql(alice_client, create.replace("Dana", "Eli"))
    assert reused["errors"][0]["extensions"]["code"] == "idempotency_key_reused"
    assert Booking.objects.get().customer == "Dana"
