"""downstream_key(): the key a protected view sends with its own calls to other APIs.

Through the real views of every integration and real stores; a real server and a
real (stand-in) payment provider for the retry that must not charge twice.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, RequestFactory, override_settings

from idempotency_django import downstream_key
from idempotency_django.downstream import NotProtected
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import RecordKey, get_store
from tests import servers
from tests.checkpoints import Checkpoint
from tests.concurrency import Background, logged_in_client
from tests.redis_helpers import redis_store_settings

pytestmark = pytest.mark.django_db(transaction=True)

HEX_64 = re.compile(r"[0-9a-f]{64}")


@pytest.fixture(autouse=True)
def downstream_urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.downstream_urls"


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        with redis_store_settings(LOCK_TIMEOUT=1):
            yield request.param
    else:
        with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 1}):
            yield request.param


def charge(client: Client, url: str, key: str, **headers: Any) -> Any:
    return client.post(
        url, b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **headers
    )


def charge_key(client: Client, url: str, key: str, **headers: str) -> str:
    response = charge(client, url, key, **headers)
    assert response.status_code == 201, response.content
    return str(json.loads(response.content)["charge_key"])


def forget_keys() -> None:
    """Let the same client key run again (as if its retention had passed)."""
    IdempotencyRecord.objects.all().delete()


# -- the same key for every attempt ------------------------------------------------------


def test_a_retry_that_takes_over_a_stale_reservation_derives_the_same_key(
    alice: User, store: str
) -> None:
    """The first attempt stalls past LOCK_TIMEOUT after calling the provider; the retry
    that takes its key over must call the provider under the same key."""
    url = "/downstream/charge/"
    with Checkpoint("stalled") as stalled:
        first = Background(
            lambda: charge(logged_in_client(alice), url, "order-7", HTTP_X_PAUSE_AT="stalled")
        ).start()
        stalled.wait_until_reached()
        record = RecordKey(f"auth.user:{alice.pk}", "", "order-7")
        servers.wait_until(
            lambda: not get_store().is_held(record), what="the reservation's expiry", seconds=30
        )
        retry = charge(logged_in_client(alice), url, "order-7")
        stalled.release()
        first.join()

    assert retry.status_code == 201, retry.content
    assert json.loads(retry.content)["charge_key"] == stalled.info["charge_key"]


def test_a_replay_names_the_key_the_first_attempt_used(alice_client: Client) -> None:
    first = charge(alice_client, "/downstream/charge/", "order-8")
    again = charge(alice_client, "/downstream/charge/", "order-8")
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == first.content


def test_every_integration_derives_the_same_key_from_the_same_scope_and_key(
    alice_client: Client,
) -> None:
    """@idempotent (sync and async), the middleware, DRF, ninja: one user's key names
    one call, however the request came in (each run after the last one's record is
    forgotten)."""
    found = set()
    for url in (
        "/downstream/charge/",
        "/downstream/middleware-charge/",
        "/downstream/async-charge/",
        "/downstream/api-charge/",
        "/downstream/ninja/charges",
    ):
        found.add(charge_key(alice_client, url, "order-9"))
        forget_keys()
    assert len(found) == 1
    assert HEX_64.fullmatch(found.pop())


# -- a key of its own for each call, principal and location ----------------------------


def test_keys_differ_by_principal_location_client_key_and_name(
    alice_client: Client, bob_client: Client
) -> None:
    url = "/downstream/charge/"
    alices = json.loads(charge(alice_client, url, "order-10").content)
    bobs = charge_key(bob_client, url, "order-10")
    in_portland = charge_key(alice_client, url, "order-10", HTTP_X_LOCATION_ID="portland")
    another = charge_key(alice_client, url, "order-11")
    keys = {alices["charge_key"], alices["refund_key"], bobs, in_portland, another}
    assert len(keys) == 5
    assert all(HEX_64.fullmatch(key) for key in keys)


def test_the_key_reveals_nothing_of_the_clients_key(alice_client: Client) -> None:
    client_key = "f" * 64  # as long as a derived key, and all hexadecimal
    derived = charge_key(alice_client, "/downstream/charge/", client_key)
    assert client_key not in derived
    assert HEX_64.fullmatch(derived)


def test_a_rotated_secret_key_derives_other_keys(alice_client: Client) -> None:
    """Documented: downstream keys follow SECRET_KEY; rotating it changes them."""
    before = charge_key(alice_client, "/downstream/charge/", "order-12")
    forget_keys()
    with override_settings(
        SECRET_KEY="another-secret", SECRET_KEY_FALLBACKS=["tests-only-not-secret"]
    ):
        after = charge_key(alice_client, "/downstream/charge/", "order-12")
    assert after != before


def test_a_webhook_delivery_names_its_calls_by_its_delivery_id(db: None) -> None:
    client = Client()
    keys = [
        json.loads(
            client.post(
                "/downstream/hooks/t0ken/",
                b"{}",
                content_type="application/json",
                HTTP_WEBHOOK_ID=delivery,
            ).content
        )["charge_key"]
        for delivery in ("evt_1", "evt_2")
    ]
    assert len(set(keys)) == 2
    duplicate = client.post(
        "/downstream/hooks/t0ken/", b"{}", content_type="application/json", HTTP_WEBHOOK_ID="evt_1"
    )
    assert duplicate.status_code == 202  # the receiver did not run again


# -- only for a request that holds a key ---------------------------------------------------


def test_a_request_no_key_protects_has_no_downstream_key(alice_client: Client) -> None:
    with pytest.raises(NotProtected, match="only for a request whose Idempotency-Key"):
        alice_client.post("/downstream/middleware-charge/", b"{}", content_type="application/json")


def test_an_anonymous_request_let_through_has_no_downstream_key(db: None) -> None:
    with pytest.raises(NotProtected):
        charge(Client(), "/downstream/middleware-charge/", "order-13")


def test_a_request_nothing_touched_has_no_downstream_key() -> None:
    with pytest.raises(NotProtected):
        downstream_key(RequestFactory().post("/"), "charge")


def test_a_call_needs_a_name(alice_client: Client) -> None:
    with pytest.raises(ValueError, match="name of the call"):
        downstream_key(RequestFactory().post("/"), "")


# -- through a real server, to a real provider -------------------------------------------


class Provider:
    """A payment provider that honours Idempotency-Key, as Stripe does.

    With ``lose_first_answers``, it charges a new key and then answers 502, as a
    gateway that lost the answer would: only a retry under the same key learns
    what was charged.
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.charges: dict[str, str] = {}
        self.lose_first_answers = False
        self.lock = threading.Lock()

    def charge(self, key: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.keys.append(key)
            replayed = key in self.charges
            if not replayed:
                self.charges[key] = f"ch_{len(self.charges) + 1}"
                if self.lose_first_answers:
                    return 502, {"error": "bad gateway"}
            return 200, {"id": self.charges[key], "replayed": replayed}


@pytest.fixture
def provider() -> Iterator[tuple[Provider, str]]:
    """The stand-in provider, and its base URL."""
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, answer = state.charge(self.headers["Idempotency-Key"])
            body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the documentation's examples ----------------------------------------------------------


def test_the_stripe_style_example_charges_once_when_the_answer_was_lost(
    alice: User, provider: tuple[Provider, str]
) -> None:
    state, base = provider
    state.lose_first_answers = True
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    with override_settings(PAYMENTS_API_URL=base, PAYMENTS_API_KEY="sk_test_example"):
        lost = charge(client, "/docs/invoices/7/pay/", "invoice-7")
        paid = charge(client, "/docs/invoices/7/pay/", "invoice-7")
        replay = charge(client, "/docs/invoices/7/pay/", "invoice-7")
    assert (lost.status_code, paid.status_code) == (500, 201)
    assert json.loads(paid.content) == {"payment": "ch_1"}
    assert replay["Idempotency-Replayed"] == "true"
    assert state.keys == [state.keys[0]] * 2 and list(state.charges) == [state.keys[0]]


def test_the_retry_client_example_sends_the_derived_key_and_retries_with_it(
    alice_client: Client, provider: tuple[Provider, str]
) -> None:
    state, base = provider
    state.lose_first_answers = True
    with override_settings(WAREHOUSE_API_URL=base, WAREHOUSE_API_TOKEN="warehouse-token"):
        shipped = charge(alice_client, "/docs/orders/12/ship/", "order-12")
    assert json.loads(shipped.content) == {"shipment": "ch_1"}
    assert len(state.keys) == 2 and state.keys[0] == state.keys[1]  # the client's own retry
    assert HEX_64.fullmatch(state.keys[0])


@pytest.fixture
def uvicorn_server(transactional_db: None, provider: tuple[Provider, str]) -> Iterator[str]:
    pytest.importorskip("uvicorn")
    with servers.running(
        lambda port: servers.uvicorn("tests.asgi:application", port),
        {
            "DJANGO_SETTINGS_MODULE": "tests.downstream_settings",
            "TESTS_PROVIDER_URL": provider[1] + "/v1/charges",
        },
        what="uvicorn",
    ) as port:
        yield f"http://127.0.0.1:{port}"


def test_a_retry_after_a_lost_answer_charges_once(
    uvicorn_server: str, provider: tuple[Provider, str], alice: User
) -> None:
    """The view charged, then failed (500, released); the client's retry runs the view
    again, which sends the provider the same key: the provider charges once."""
    logged_in = servers.logged_in_headers(alice)

    def post() -> tuple[int, dict[str, Any]]:
        status, _, body = servers.post(
            uvicorn_server + "/downstream/charge/?crash=1",
            b"{}",
            {"Content-Type": "application/json", "Idempotency-Key": "order-42", **logged_in},
        )
        return status, json.loads(body)

    lost, _ = post()
    retried, answer = post()
    state, _ = provider

    assert (lost, retried) == (500, 201)
    assert len(state.keys) == 2 and state.keys[0] == state.keys[1]  # one key, sent twice
    assert list(state.charges.values()) == ["ch_1"]  # charged once
    assert answer == {
        "charge_key": state.keys[0],
        "refund_key": answer["refund_key"],
        "charge": "ch_1",
    }
    assert "order-42" not in state.keys[0]
