"""Under ASGI a sync view runs in a thread that a hang-up cannot stop, but the
cancellation reaches the async code it calls (``async_to_sync``, a signal's async
receiver). A view protected by a door inside it (``@idempotent``, DRF, a webhook
receiver, django-ninja) must still run to its end: its answer is stored, and the
client's retry gets it. Before, the view stopped half-way, its key stayed reserved
over half-done work, and the retry after ``LOCK_TIMEOUT`` ran the first half again."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User

from tests.hangup.servers import Browser, serve
from tests.hangup.test_hangups import answer, retry_until_settled
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)

DELIVERY = {"Webhook-Id": "delivery-a2s"}


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.mark.parametrize(
    ("path", "slot", "answered"),
    [
        ("/a2s/decorated/", "decorated", "replayed 201"),
        ("/a2s/drf/", "drf", "replayed 201"),
        ("/a2s/hooks/provider-token/", "hook", "duplicate"),
        ("/a2s/ninja", "ninja", "replayed 200"),
        ("/a2s/signalled/", "signal", "replayed 201"),
    ],
)
def test_a_sync_view_calling_async_code_runs_to_its_end_after_a_hang_up(
    alice: User, path: str, slot: str, answered: str
) -> None:
    with serve("uvicorn", HANGUP_LOCK_TIMEOUT="3") as port:
        browser = Browser(port).login("alice", "alice-password")
        browser.hang_up(f"{path}?delay=1.5", key=f"a2s-{slot}", after=0.4, **DELIVERY)
        time.sleep(2.5)  # the view's end, had it run on
        retry = retry_until_settled(browser, f"{path}?delay=1.5", f"a2s-{slot}", **DELIVERY)
    slots = sorted(Booking.objects.values_list("slot", flat=True))
    assert (answer(retry), slots) == (answered, [f"{slot}-1", f"{slot}-2"])
