"""A model of the whole protocol: requests that fail at every step, and clients that hang up.

``test_store_protocol.py`` checks the stores' own contract. This machine drives
whole requests through :func:`~idempotency_django.protocol.phases.run` (sync, in the
transaction the middleware opens) and :func:`~idempotency_django.protocol.phases.arun`
(async, the task cancelled as Django cancels it when the client disconnects),
with a view that books one ``Booking`` per run. Each request may:

* succeed; raise in the view; answer a 5xx after booking; succeed in the
  view and then fail on the way out (a later middleware turning it into a 5xx);
  or book a row whose COMMIT fails (a deferred foreign key), with the record in
  the same database or in a store of its own (Redis), where the answer must
  wait for the work's commit;
* under ASGI, be cancelled before its claim, during the claim, during the view,
  or during the completion (while it renders the response, as a TemplateResponse).

After every request, for every key, the database must say one of two things:
the key is free and nothing was booked for it, or its response is stored and
exactly one booking exists. That is: a stored response exists only if its
work committed, a key is never left free while its work may still commit,
and nothing runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import arun, begin, run
from idempotency_django.stores import Outcome, get_store
from tests import redis_helpers
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = ("k1", "k2", "k3")
SYNC_FAILURES = ("none", "view_raises", "server_error", "fails_after_view", "commit_fails")
HANG_UPS = ("none", "before_claim", "during_claim", "during_view", "during_completion")
SETTINGS = settings(
    max_examples=15,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class ViewFailed(Exception):
    pass


def keyed_request(user: User, key: str) -> HttpRequest:
    request = RequestFactory().post(
        "/plain/bookings/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    request.user = user
    return request


def book(key: str, failure: str) -> HttpResponse:
    # A dangling owner: the database finds it at COMMIT (Django's foreign keys are deferred).
    owner_id = 10**9 if failure == "commit_fails" else None
    Booking.objects.create(slot=key, owner_id=owner_id)
    if failure == "view_raises":
        raise ViewFailed
    return HttpResponse(b"booked " + key.encode(), status=500 if failure == "server_error" else 201)


class Protocol(RuleBasedStateMachine):
    user: User

    def __init__(self) -> None:
        super().__init__()
        Booking.objects.all().delete()
        IdempotencyRecord.objects.all().delete()
        if get_store().database_alias is None:  # the Redis store
            redis_helpers.raw_client().flushdb()

    @rule(key=st.sampled_from(KEYS), failure=st.sampled_from(SYNC_FAILURES))
    def sync_request(self, key: str, failure: str) -> None:
        """Under WSGI, in the transaction the middleware opens (``ATOMIC_REQUESTS``)."""
        request = keyed_request(self.user, key)

        def call_view(_request: Any) -> HttpResponse:
            response = book(key, failure)
            if failure == "fails_after_view":
                # What Django makes of a middleware that raised after the view.
                return HttpResponse(status=500)
            return response

        with contextlib.suppress(ViewFailed, IntegrityError):
            run(request, ViewOptions(), call_view, transaction.atomic)

    @rule(key=st.sampled_from(KEYS), hang_up=st.sampled_from(HANG_UPS))
    def async_request(self, key: str, hang_up: str) -> None:
        """Under ASGI, without a transaction (Django allows none around async views)."""
        request = keyed_request(self.user, key)
        in_claim, in_view, go_on = threading.Event(), asyncio.Event(), threading.Event()
        in_completion, completion_goes_on = threading.Event(), threading.Event()

        def begin_phase(request: Any, options: ViewOptions) -> Any:
            in_claim.set()
            outcome = begin(request, options)
            go_on.wait(5)
            return outcome

        async def call_view(_request: Any) -> HttpResponse:
            response = await sync_to_async(book)(key, "none")
            in_view.set()
            await asyncio.sleep(0.05)
            # Rendered by the completion, in its thread: the client hangs up then.
            return LazyResponse(response, in_completion, completion_goes_on)

        async def client() -> None:
            task = asyncio.ensure_future(arun(request, ViewOptions(), call_view, begin_phase))
            if hang_up == "before_claim":
                task.cancel()
            elif hang_up == "during_claim":
                await wait_for(in_claim.is_set)
                task.cancel()
            elif hang_up == "during_view":
                go_on.set()
                # A replay or a conflict runs no view: nothing to hang up on then.
                view_reached = asyncio.ensure_future(in_view.wait())
                await asyncio.wait({task, view_reached}, return_when=asyncio.FIRST_COMPLETED)
                view_reached.cancel()
                task.cancel()
            elif hang_up == "during_completion":
                go_on.set()
                completing = asyncio.ensure_future(wait_for(in_completion.is_set))
                await asyncio.wait({task, completing}, return_when=asyncio.FIRST_COMPLETED)
                completing.cancel()
                task.cancel()
            go_on.set()
            completion_goes_on.set()
            try:
                await task
            except asyncio.CancelledError:
                assert hang_up != "none"
            # Whatever the view answered went through the completion, rendered there.
            assert in_completion.is_set() == in_view.is_set()

        async_to_sync(client)()

    @invariant()
    def each_key_is_free_with_nothing_booked_or_stored_with_one_booking(self) -> None:
        store = get_store()
        for key in KEYS:
            state = store.peek(record_key(self.user, key))
            booked = Booking.objects.filter(slot=key).count()
            assert (state, booked) in {(None, 0), (Outcome.REPLAY, 1)}, (key, state, booked)


class LazyResponse(HttpResponse):
    """A response rendered late, as a TemplateResponse is: by the completion, in its thread."""

    def __init__(
        self, response: HttpResponse, rendering: threading.Event, go_on: threading.Event
    ) -> None:
        super().__init__(response.content, status=response.status_code)
        self.is_rendered = False
        self.rendering, self.go_on = rendering, go_on

    def render(self) -> LazyResponse:
        self.rendering.set()
        self.go_on.wait(5)
        self.is_rendered = True
        return self


async def wait_for(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def record_key(user: User, key: str) -> Any:
    from idempotency_django.protocol.scope import default_scope
    from idempotency_django.stores import RecordKey

    scope = default_scope(keyed_request(user, key))
    assert scope is not None
    return RecordKey(scope.principal, scope.location, key)


@pytest.mark.parametrize(
    "store",
    [
        "database",
        # The record in a store of its own: the work's COMMIT fails after the
        # reservation was renewed, so the answer must wait for that commit.
        pytest.param("redis", marks=pytest.mark.services),
    ],
)
def test_every_request_settles_to_free_and_unbooked_or_stored_and_booked_once(
    store: str, django_user_model: type[User]
) -> None:
    if connection.vendor == "mysql":
        pytest.skip("MariaDB checks foreign keys at once, not at COMMIT")
    user = django_user_model.objects.create_user("model")
    machine = type("ProtocolModel", (Protocol,), {"user": user})
    with redis_helpers.redis_store_settings() if store == "redis" else contextlib.nullcontext():
        run_state_machine_as_test(machine, settings=SETTINGS)
