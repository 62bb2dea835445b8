"""downstream_key(): the key a protected view sends with its own calls to other APIs.

Through the real views of every integration and real stores; a real server and a
real (stand-in) payment provider for the retry that must not charge twice.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, RequestFactory, override_settings
from django.utils.crypto import salted_hmac

from idempotency_django import downstream_key
from idempotency_django.conf import idempotency_settings
from idempotency_django.downstream import SALT, NotProtected
from idempotency_django.models import IdempotencyRecord
from idempotency_django.purge import database_now, purge
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


def test_every_integration_derives_the_key_from_its_records_scope_and_fingerprint(
    alice: User, alice_client: Client
) -> None:
    """@idempotent (sync and async), the middleware, DRF, ninja: the key is the HMAC of
    what the claim stored, the scope, the client's key and the fingerprint that tells
    the request's retries from other requests (each run after the last one's record
    is forgotten). Five URLs are five requests: five keys."""
    found = set()
    for url in (
        "/downstream/charge/",
        "/downstream/middleware-charge/",
        "/downstream/async-charge/",
        "/downstream/api-charge/",
        "/downstream/ninja/charges",
    ):
        derived = charge_key(alice_client, url, "order-9")
        record = IdempotencyRecord.objects.get()
        parts = [record.principal, record.location, record.key, record.fingerprint, "charge"]
        expected = salted_hmac(SALT, json.dumps(parts), algorithm="sha256").hexdigest()
        assert (record.principal, derived) == (f"auth.user:{alice.pk}", expected)
        found.add(derived)
        forget_keys()
    assert len(found) == 5


# -- the same request, not only the same key -----------------------------------------------


def test_the_key_is_the_same_for_the_same_request_and_another_for_another(
    alice_client: Client,
) -> None:
    """Under one client key: a retry sends what the first attempt sent and gets its key;
    a request fixed after a 4xx gave the key back, or a new one after the key's record
    expired, differs in its body, path or method, and must not be sent to the provider
    as the first call (it would refuse other parameters, or replay the first charge)."""
    url = "/downstream/charge/"

    def key_for(body: bytes, path: str = url, method: str = "post") -> str:
        response = getattr(alice_client, method)(
            path, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="order-14"
        )
        assert response.status_code == 201, response.content
        forget_keys()  # the key free again, as after a 4xx, a 5xx or its retention
        return str(json.loads(response.content)["charge_key"])

    first = key_for(b'{"order": 14}')
    assert key_for(b'{"order": 14}') == first
    others = {
        key_for(b'{"order": 15}'),
        key_for(b'{"order": 14}', url + "?express=1"),
        key_for(b'{"order": 14}', method="put"),
    }
    assert len(others) == 3 and first not in others
    assert all(HEX_64.fullmatch(key) for key in others)


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


def test_a_keyless_request_under_a_window_has_no_downstream_key(alice_client: Client) -> None:
    """A window's key is made of the body alone: two deliberate identical orders sent after
    the window would share one downstream key, and the provider would replay the first's
    charge to the second (a lost order). Such a request has no key to derive one from."""
    with pytest.raises(NotProtected):
        alice_client.post("/downstream/window-charge/", b"{}", content_type="application/json")


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


#: Stripe's test card that is always declined.
DECLINED_CARD = "4000000000000002"


class Provider:
    """A payment provider that honours Idempotency-Key, as Stripe does.

    The first call under a key decides its answer: a charge, or ``402`` when the
    parameters name ``DECLINED_CARD``. The key sent again with the same parameters
    gets that answer again (``"replayed": true``, nothing charged); with other
    parameters, ``400``. With ``lose_first_answers``, it charges a new key and
    then answers 502, as a gateway that lost the answer would: only a retry under
    the same key learns what was charged.
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        #: key -> charge id, for each key that charged.
        self.charges: dict[str, str] = {}
        #: key -> (parameters, status, answer) as first decided.
        self.answers: dict[str, tuple[bytes, int, dict[str, Any]]] = {}
        self.lose_first_answers = False
        self.lock = threading.Lock()

    def charge(self, key: str, params: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.keys.append(key)
            if key in self.answers:
                first, status, answer = self.answers[key]
                if params != first:  # the same view sends the same bytes for the same call
                    return 400, {"error": {"type": "idempotency_error"}}
                return status, {**answer, "replayed": True}
            if DECLINED_CARD.encode() in params:
                status, answer = 402, {"error": {"code": "card_declined"}}
            else:
                self.charges[key] = f"ch_{len(self.charges) + 1}"
                status, answer = 200, {"id": self.charges[key]}
            self.answers[key] = (params, status, answer)
            if self.lose_first_answers and status == 200:
                return 502, {"error": "bad gateway"}
            return status, {**answer, "replayed": False}


@pytest.fixture
def provider() -> Iterator[tuple[Provider, str]]:
    """The stand-in provider, and its base URL."""
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            params = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, answer = state.charge(self.headers["Idempotency-Key"], params)
            body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # A short poll: shutdown() waits for it, in every test that uses the provider.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
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
    with servers.test_project_on_uvicorn(
        "tests.downstream_settings", TESTS_PROVIDER_URL=provider[1] + "/v1/charges"
    ) as url:
        yield url


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


#: A card the stand-in provider charges.
GOOD_CARD = "4242424242424242"


def paying(server: str, user: User) -> Callable[..., tuple[int, dict[str, Any]]]:
    """``pay(key, order, card=GOOD_CARD, crash=False)``: ``user`` pays 42.00 for ``order``
    through the real server's /downstream/pay/: its status and JSON answer."""
    headers = {"Content-Type": "application/json", **servers.logged_in_headers(user)}

    def pay(
        key: str, order: int, card: str = GOOD_CARD, crash: bool = False
    ) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"order": order, "amount": 4200, "card": card}).encode()
        url = server + "/downstream/pay/" + ("?crash=1" if crash else "")
        status, _, answer = servers.post(url, body, {**headers, "Idempotency-Key": key})
        return status, json.loads(answer)

    return pay


def test_a_card_fixed_after_a_decline_is_charged_under_the_same_client_key(
    uvicorn_server: str, provider: tuple[Provider, str], alice: User
) -> None:
    """The card is declined (402: the key is given back, as the docs invite); the
    customer fixes it and sends the order again under the same key. Its downstream key
    must be new: the provider refuses the declined call's key with other parameters."""
    pay = paying(uvicorn_server, alice)
    state, _ = provider

    declined = pay("order-51", order=51, card=DECLINED_CARD)
    fixed = pay("order-51", order=51)

    assert (declined, fixed) == ((402, {"error": "card_declined"}), (201, {"charge": "ch_1"}))
    assert len(state.keys) == 2 and len(set(state.keys)) == 2
    assert list(state.charges.values()) == ["ch_1"]


def test_a_client_key_used_again_after_its_record_expired_charges_the_new_order(
    uvicorn_server: str, provider: tuple[Provider, str], alice: User
) -> None:
    """Past our retention the key is free: the same client key for another order of the
    same amount is a new charge, not the provider's replay of the old one."""
    pay = paying(uvicorn_server, alice)
    state, _ = provider

    first = pay("checkout", order=61)
    # The cron purge once the record's retention has passed (the database's clock).
    later = database_now("default") + timedelta(seconds=idempotency_settings.RETENTION + 1)
    assert purge(now=later)["completed"] == 1
    second = pay("checkout", order=62)

    assert (first, second) == ((201, {"charge": "ch_1"}), (201, {"charge": "ch_2"}))
    assert len(set(state.keys)) == 2 and len(state.charges) == 2


def test_a_true_retry_after_a_lost_answer_is_replayed_by_the_provider(
    uvicorn_server: str, provider: tuple[Provider, str], alice: User
) -> None:
    """The same order under the same key after the view lost the provider's answer
    (500, key released): the provider replays the charge; the customer pays once."""
    pay = paying(uvicorn_server, alice)
    state, _ = provider

    lost = pay("order-71", order=71, crash=True)
    retried = pay("order-71", order=71, crash=True)

    assert (lost[0], retried) == (500, (201, {"charge": "ch_1"}))
    assert len(state.keys) == 2 and state.keys[0] == state.keys[1]
    assert list(state.charges.values()) == ["ch_1"]
