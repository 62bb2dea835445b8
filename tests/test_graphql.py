"""idempotency_django.graphql with Django's test client: the key, the scope, the answers."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Annotated, Any, cast

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from idempotency_django.decorators import idempotency_exempt
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import get_store
from tests.redis_helpers import DOWN_ALIAS, caches_with
from tests.testapp.models import Booking

pytest.importorskip("strawberry")

import strawberry
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from strawberry.django.views import AsyncGraphQLView, GraphQLView
from strawberry.file_uploads import Upload
from strawberry.scalars import Base64
from strawberry.schema.config import StrawberryConfig

from idempotency_django.downstream import NotProtected, downstream_key
from idempotency_django.graphql import Idempotent
from tests.graphql_server.schema import Query

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


FRAGMENTS = [
    'mutation { ... on Mutation { count(slot: "f") } }',
    'mutation { ...Count ...Count } fragment Count on Mutation { count(slot: "f") }',
]


@pytest.mark.parametrize("query", FRAGMENTS, ids=["inline-fragment", "named-fragment-twice"])
def test_the_header_keys_a_mutation_selected_through_fragments(
    alice_client: Client, query: str
) -> None:
    """A root field in a fragment (spread once or twice) is still the one protected mutation."""
    keyed = {"Idempotency-Key": "fragment-key"}
    first = graphql(alice_client, query, headers=keyed)
    assert "errors" not in first, first
    assert graphql(alice_client, query, headers=keyed) == first
    assert Booking.objects.count() == 1


# -- a schema of this module's own: what a result may be, and what a resolver may take --


@strawberry.type
class Visit:
    id: int
    day: datetime.date
    at: datetime.time
    booked: datetime.datetime
    note: str | None = None


@dataclasses.dataclass
class Money:
    """Under a scalar of its own: a dataclass, kept as its fields."""

    amount: Decimal
    currency: str


def parse_money(value: str) -> Money:
    amount, currency = value.split()
    return Money(Decimal(amount), currency)


class Point:
    """Under a scalar of its own: an object of one's own, not JSON, so never kept."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y


SCALARS: dict[object, Any] = {
    Money: strawberry.scalar(
        name="Money",
        serialize=lambda money: f"{money.amount} {money.currency}",
        parse_value=parse_money,
    ),
    Point: strawberry.scalar(name="Point", serialize=lambda point: f"{point.x},{point.y}"),
}


def protected(resolver: Callable[..., Any]) -> Any:
    """``@strawberry.mutation(extensions=[Idempotent()])``, which mypy sees as untyped."""
    return strawberry.mutation(resolver, extensions=[Idempotent()])


def booked(info: strawberry.Info, slot: str) -> int:
    return Booking.objects.create(slot=slot, owner=info.context.request.user).pk


@strawberry.type
class OwnMutation:
    @protected
    def visit(self, info: strawberry.Info, slot: str) -> Visit | None:
        pk = booked(info, slot)
        if slot == "nowhere":
            return None
        day, at = datetime.date(2026, 7, 30), datetime.time(9, 30)
        return Visit(id=pk, day=day, at=at, booked=datetime.datetime.combine(day, at, datetime.UTC))

    @protected
    def keyed(self, info: strawberry.Info, slot: str, idempotency_key: str | None = None) -> str:
        """A resolver that takes the key itself."""
        return f"{booked(info, slot)} under {idempotency_key}"

    @protected
    def pay(self, info: strawberry.Info, price: Money) -> int:
        return booked(info, f"paid {price.amount}")

    @protected
    def price(self, info: strawberry.Info, slot: str) -> Money:
        return Money(Decimal(booked(info, slot)), "EUR")

    @protected
    def locate(self, info: strawberry.Info, slot: str) -> Point:
        return Point(booked(info, slot), 0)

    @protected
    def rename(self, info: strawberry.Info, name: strawberry.Maybe[str | None] = None) -> int:
        return booked(info, (name.value or "null") if name else "left out")

    @protected
    def noted(self, info: strawberry.Info, slot: str) -> Visit:
        """A result with a field left UNSET."""
        day, at = datetime.date(2026, 7, 30), datetime.time(9, 30)
        visit = Visit(id=booked(info, slot), day=day, at=at, booked=datetime.datetime(2026, 7, 30))
        visit.note = strawberry.UNSET
        return visit

    @protected
    def charge(self, info: strawberry.Info, amount: int) -> str:
        """The key a provider would be sent for this mutation, or why there is none."""
        booked(info, f"charged {amount}")
        try:
            return downstream_key(info.context.request, "charge")
        except NotProtected:
            return "not protected"

    @protected
    def attach(self, info: strawberry.Info, data: Base64) -> int:
        return booked(info, data.decode())

    @protected
    def upload(self, info: strawberry.Info, file: Upload) -> int:
        return booked(info, cast("UploadedFile[bytes]", file).read().decode())


@strawberry.type
class Receipt:
    id: int
    slot: str


@strawberry.type
class Order:
    id: int
    # A lazy reference, as schemas split over modules write it (circular imports).
    receipt: Annotated[Receipt, strawberry.lazy("tests.test_graphql")]


@strawberry.type
class LazyMutation:
    @protected
    def order(
        self, info: strawberry.Info, slot: str
    ) -> Annotated[Receipt, strawberry.lazy("tests.test_graphql")]:
        return Receipt(id=booked(info, slot), slot=slot)

    @protected
    def nested(self, info: strawberry.Info, slot: str) -> Order:
        pk = booked(info, slot)
        return Order(id=pk, receipt=Receipt(id=pk, slot=slot))


@strawberry.type
class SharedMutation:
    """One Mutation type served by two schemas (a public and an internal endpoint)."""

    @protected
    def count(self, info: strawberry.Info, slot: str) -> int:
        return booked(info, slot)

    @protected
    def keyed(self, info: strawberry.Info, slot: str, idempotency_key: str | None = None) -> str:
        return f"{booked(info, slot)} under {idempotency_key}"


@strawberry.type
class BatchMutation:
    @protected
    def count(self, info: strawberry.Info, slot: str) -> int:
        return booked(info, slot)

    @protected
    def upload(self, info: strawberry.Info, file: Upload) -> int:
        return booked(info, cast("UploadedFile[bytes]", file).read().decode())


own_schema = strawberry.Schema(
    query=Query, mutation=OwnMutation, config=StrawberryConfig(scalar_map=SCALARS)
)
own_view = GraphQLView.as_view(schema=own_schema, multipart_uploads_enabled=True)
lazy_schema = strawberry.Schema(query=Query, mutation=LazyMutation)
public_schema = strawberry.Schema(query=Query, mutation=SharedMutation)
internal_schema = strawberry.Schema(query=Query, mutation=SharedMutation)
batch_schema = strawberry.Schema(
    query=Query,
    mutation=BatchMutation,
    config=StrawberryConfig(batching_config={"max_operations": 5}),
)
urlpatterns = [
    path("graphql/", idempotency_exempt(own_view)),
    path("lazy/", idempotency_exempt(GraphQLView.as_view(schema=lazy_schema))),
    path("public/", idempotency_exempt(GraphQLView.as_view(schema=public_schema))),
    path("internal/", idempotency_exempt(GraphQLView.as_view(schema=internal_schema))),
    path(
        "batch/",
        idempotency_exempt(
            GraphQLView.as_view(schema=batch_schema, multipart_uploads_enabled=True)
        ),
    ),
    path("async-batch/", idempotency_exempt(AsyncGraphQLView.as_view(schema=batch_schema))),
]

VISIT = "mutation($slot: String!) { visit(slot: $slot, idempotencyKey: $slot) { %s } }"


@pytest.mark.urls(__name__)
def test_a_retry_gets_the_dates_times_and_nulls_of_the_first_call(alice_client: Client) -> None:
    """Dates and times are kept as text and read back as such; a null result, as null."""
    fields = "id day at booked note"  # the note: None
    first = graphql(alice_client, VISIT % fields, slot="09:30")
    assert first["data"]["visit"] == {
        "id": Booking.objects.get().pk,
        "day": "2026-07-30",
        "at": "09:30:00",
        "booked": "2026-07-30T09:30:00+00:00",
        "note": None,
    }
    assert graphql(alice_client, VISIT % fields, slot="09:30") == first
    nowhere = graphql(alice_client, VISIT % "id", slot="nowhere")
    assert nowhere == {"data": {"visit": None}}
    assert graphql(alice_client, VISIT % "id", slot="nowhere") == nowhere
    assert Booking.objects.count() == 2


@pytest.mark.urls(__name__)
def test_a_resolver_that_takes_the_key_gets_it_and_runs_once(alice_client: Client) -> None:
    """A resolver that declares ``idempotency_key`` is handed the key; the field is guarded."""
    call = 'mutation { keyed(slot: "k", idempotencyKey: "own-key") }'
    first = graphql(alice_client, call)
    assert first["data"]["keyed"] == f"{Booking.objects.get().pk} under own-key"
    assert graphql(alice_client, call) == first
    assert Booking.objects.count() == 1


@pytest.mark.urls(__name__)
def test_an_argument_of_a_scalar_over_a_dataclass_counts_by_its_fields(
    alice_client: Client,
) -> None:
    """A dataclass under a scalar of its own is fingerprinted by its fields."""
    call = 'mutation { pay(price: "%s", idempotencyKey: "pay") }'
    first = graphql(alice_client, call % "12.50 EUR")
    assert "errors" not in first, first
    assert graphql(alice_client, call % "12.50 EUR") == first
    assert codes(graphql(alice_client, call % "12.50 USD")) == ["idempotency_key_reused"]
    assert Booking.objects.count() == 1


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("field", ["locate", "price"], ids=["object", "dataclass"])
def test_a_result_that_cannot_be_kept_fails_and_takes_back_its_work(
    alice_client: Client, atomic_requests: None, field: str
) -> None:
    """docs/graphql.md: the call fails with a TypeError, its key is given back and, under a
    transaction, its work is rolled back. An object of one's own under a scalar of one's
    own, a dataclass too: a replay could give the scalar its fields' JSON only."""
    call = f'mutation {{ {field}(slot: "p", idempotencyKey: "kept") }}'
    answer = graphql(alice_client, call)
    assert "cannot be kept for its retries" in answer["errors"][0]["message"]
    assert not IdempotencyRecord.objects.exists()
    assert Booking.objects.count() == 0


@pytest.mark.parametrize("context", [{"request": None}, None], ids=["no-request", "no-context"])
def test_without_django_s_request_the_mutation_says_how_to_serve_it(context: Any) -> None:
    """Served other than by Strawberry's Django views: the error says how, nothing runs."""
    answer = own_schema.execute_sync(
        'mutation { keyed(slot: "k", idempotencyKey: "k") }', context_value=context
    )
    assert answer.errors is not None
    assert "serve the schema with strawberry.django.views.GraphQLView" in answer.errors[0].message
    assert Booking.objects.count() == 0


@pytest.mark.urls(__name__)
def test_a_maybe_argument_is_fingerprinted(alice_client: Client) -> None:
    """strawberry.Maybe tells an omitted argument from null: a partial update's arguments."""

    def rename(name: str, key: str) -> dict[str, Any]:
        return graphql(alice_client, f"mutation {{ rename({name}idempotencyKey: {key}) }}")

    answer = rename('name: "Dana", ', '"r"')
    assert "errors" not in answer, answer
    assert rename('name: "Dana", ', '"r"') == answer
    assert codes(rename("name: null, ", '"r"')) == ["idempotency_key_reused"]
    omitted = rename("", '"left-out"')
    assert "errors" not in omitted, omitted
    assert codes(rename("name: null, ", '"left-out"')) == ["idempotency_key_reused"]
    assert Booking.objects.count() == 2


@pytest.mark.urls(__name__)
def test_a_result_field_left_unset_replays_as_first_answered(alice_client: Client) -> None:
    """What a first call answered, its retry gets."""
    call = 'mutation { noted(slot: "u", idempotencyKey: "unset") { id note } }'
    first = graphql(alice_client, call)
    assert graphql(alice_client, call) == first


@pytest.mark.urls(__name__)
def test_a_mutation_without_a_key_has_no_downstream_key_of_another(alice_client: Client) -> None:
    """One request, two mutations: the second, sent without a key, holds none; it never
    gets the first one's, which a provider would replay or refuse."""
    call = 'mutation { a: charge(amount: 5, idempotencyKey: "k1") b: charge(amount: 7) }'
    answer = graphql(alice_client, call)["data"]
    assert len(answer["a"]) == 64
    assert answer["b"] == "not protected"
    assert graphql(alice_client, call)["data"]["a"] == answer["a"]  # a's replay: the same


@pytest.mark.urls(__name__)
def test_bytes_count_by_their_content_and_a_call_without_a_key_reads_none(
    alice_client: Client,
) -> None:
    """A ``Base64`` argument: the same bytes replay, others are another request; without a
    key the mutation runs, unprotected, as any."""
    call = 'mutation { attach(data: "%s"%s) }'
    first = graphql(alice_client, call % ("aGVsbG8=", ', idempotencyKey: "b"'))  # "hello"
    assert "errors" not in first, first
    assert graphql(alice_client, call % ("aGVsbG8=", ', idempotencyKey: "b"')) == first
    other = graphql(alice_client, call % ("aGVsbG8h", ', idempotencyKey: "b"'))  # "hello!"
    assert codes(other) == ["idempotency_key_reused"]
    assert "errors" not in graphql(alice_client, call % ("aGVsbG8=", ""))
    assert list(Booking.objects.values_list("slot", flat=True)) == ["hello", "hello"]


def upload(client: Client, content: bytes, name: str = "slots.txt") -> dict[str, Any]:
    """The GraphQL multipart request spec: the operation, where its file goes, the file."""
    operation = 'mutation($file: Upload!) { upload(file: $file, idempotencyKey: "file") }'
    response = client.post(
        "/graphql/",
        {
            "operations": json.dumps({"query": operation, "variables": {"file": None}}),
            "map": json.dumps({"0": ["variables.file"]}),
            "0": SimpleUploadedFile(name, content, content_type="text/plain"),
        },
    )
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.urls(__name__)
def test_an_uploaded_file_counts_by_its_content_and_the_resolver_reads_it_whole(
    alice_client: Client,
) -> None:
    first = upload(alice_client, b"09:00")
    assert "errors" not in first, first
    assert upload(alice_client, b"09:00") == first
    assert codes(upload(alice_client, b"10:00")) == ["idempotency_key_reused"]
    assert codes(upload(alice_client, b"09:00", name="other.txt")) == ["idempotency_key_reused"]
    assert list(Booking.objects.values_list("slot", flat=True)) == ["09:00"]


@pytest.mark.urls(__name__)
def test_a_keyed_upload_over_the_body_limit_runs(alice_client: Client) -> None:
    """``MAX_FINGERPRINTED_BODY`` bounds a body the fingerprint reads: a mutation's
    fingerprint is its arguments, and a file counts by its SHA-256. An upload larger than
    the limit runs and replays (a change of this stop refused it 413 for a while)."""
    with override_settings(IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 200}):
        first = upload(alice_client, b"09:00" + b" " * 300)
        again = upload(alice_client, b"09:00" + b" " * 300)
    assert "errors" not in first, first
    assert again == first
    assert Booking.objects.count() == 1


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("field", ["order", "nested"], ids=["lazy-result", "lazy-field"])
def test_a_result_of_a_lazy_type_replays(alice_client: Client, field: str) -> None:
    """A return type or a field's type named by ``strawberry.lazy`` (a schema split over
    modules) is kept and rebuilt as any."""
    selection = "id slot" if field == "order" else "id receipt { id slot }"
    call = f'mutation {{ {field}(slot: "l", idempotencyKey: "lazy") {{ {selection} }} }}'
    first = graphql(alice_client, call, "/lazy/")
    assert "errors" not in first, first
    assert graphql(alice_client, call, "/lazy/") == first
    assert Booking.objects.count() == 1


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("url", ["/public/", "/internal/"])
def test_a_mutation_type_served_by_two_schemas_runs_once_per_key(
    alice_client: Client, url: str
) -> None:
    """One Mutation type under two schemas (a public and an internal endpoint) failed on
    every call on both: the second schema's build took the key argument the first one
    added for the resolver's own, and handed the key to a resolver that takes none
    (TypeError: unexpected keyword argument 'idempotency_key'). A resolver that does take
    the key still gets it."""
    call = 'mutation { count(slot: "s", idempotencyKey: "shared") }'
    first = graphql(alice_client, call, url)
    assert "errors" not in first, first
    assert graphql(alice_client, call, url) == first
    keyed = 'mutation { keyed(slot: "k", idempotencyKey: "own") }'
    answer = graphql(alice_client, keyed, url)
    assert answer["data"]["keyed"] == f"{Booking.objects.get(slot='k').pk} under own"
    assert graphql(alice_client, keyed, url) == answer
    assert Booking.objects.count() == 2


def batch(
    client: Client, operations: list[str], path: str = "/batch/", **headers: str
) -> list[dict[str, Any]]:
    """Strawberry's batching: one request, a JSON list of operations."""
    body = json.dumps([{"query": query} for query in operations])
    response = client.post(path, body, content_type="application/json", headers=headers)
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


KEYED = {"Idempotency-Key": "one-key"}


@pytest.mark.urls(__name__)
def test_a_batch_of_two_mutations_is_not_keyed_by_the_header(alice_client: Client) -> None:
    """docs/graphql.md: with more than one protected mutation in a request, the header keys
    none of them. A batch (Strawberry's batching) sends several operations in one request:
    the header keyed each, so the second was refused ``idempotency_key_reused``, and two
    identical ones ran once, the second answered the first's result (a lost write)."""
    different = batch(
        alice_client, ['mutation { count(slot: "a") }', 'mutation { count(slot: "b") }'], **KEYED
    )
    assert all("errors" not in answer for answer in different), different
    same = batch(alice_client, ['mutation { count(slot: "c") }'] * 2, **KEYED)
    assert same[0]["data"] != same[1]["data"], same
    assert Booking.objects.count() == 4
    # Each keyed by its argument, a batch replays; one operation alone, by the header.
    by_argument = [f'mutation {{ count(slot: "d", idempotencyKey: "{key}") }}' for key in "xy"]
    first = batch(alice_client, by_argument, **KEYED)
    assert batch(alice_client, by_argument, **KEYED) == first
    alone = graphql(alice_client, 'mutation { count(slot: "e") }', "/batch/", headers=KEYED)
    assert graphql(alice_client, 'mutation { count(slot: "e") }', "/batch/", headers=KEYED) == alone
    assert Booking.objects.count() == 7


@pytest.mark.urls(__name__)
def test_a_multipart_batch_is_not_keyed_by_the_header(alice_client: Client) -> None:
    """A batch with files: its operations, a JSON list, in the form's ``operations``."""
    operation = {
        "query": "mutation($file: Upload!) { upload(file: $file) }",
        "variables": {"file": None},
    }
    form = {
        "operations": json.dumps([operation, operation]),
        "map": json.dumps({"0": ["0.variables.file"], "1": ["1.variables.file"]}),
        "0": SimpleUploadedFile("a.txt", b"09:00", content_type="text/plain"),
        "1": SimpleUploadedFile("b.txt", b"10:00", content_type="text/plain"),
    }
    response = alice_client.post("/batch/", form, headers=KEYED)
    assert response.status_code == 200, response.content
    assert all("errors" not in answer for answer in response.json()), response.json()
    assert sorted(Booking.objects.values_list("slot", flat=True)) == ["09:00", "10:00"]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_batch_under_the_async_view_is_not_keyed_by_the_header(alice: User) -> None:
    async def post() -> list[dict[str, Any]]:
        client = AsyncClient()
        await client.aforce_login(alice)
        body = json.dumps([{"query": 'mutation { count(slot: "a") }'}] * 2)
        response = await client.post(
            "/async-batch/", body, content_type="application/json", headers=KEYED
        )
        return response.json()  # type: ignore[no-any-return]

    answers = async_to_sync(post)()
    assert all("errors" not in answer for answer in answers), answers
    assert Booking.objects.count() == 2
