"""Issue 24's findings, each reproduced through the real stack and a real store.

Every test here failed on 0d3b924 (the reason is in its docstring), except
the ones that say they keep 0.1's records working.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import include, path
from django.utils.crypto import salted_hmac
from django.views.decorators.csrf import csrf_exempt
from rest_framework.authentication import BaseAuthentication
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from idempotency_django.checks import check_settings
from idempotency_django.conf import DEFAULTS
from idempotency_django.decorators import idempotent
from idempotency_django.models import IdempotencyRecord, WebhookDelivery
from idempotency_django.protocol.bodies import BODY_COPY_ATTRIBUTE, kept_by_django
from idempotency_django.protocol.fingerprint import FINGERPRINT_SALT
from idempotency_django.protocol.scope import Scope
from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse, get_store
from idempotency_django.webhooks import deduplicate_webhook, stripe_event_id
from idempotency_django.webhooks.receivers import check_receiver_namespaces
from tests.docs_examples.webhooks import WEBHOOK_SECRET, sign
from tests.redis_helpers import (
    caches_with,
    private_redis_server,
    redis_cache,
    redis_store_settings,
)
from tests.testapp.models import Booking

# -- views of this module's URLconf ---------------------------------------------


def _run(slot: str) -> HttpResponse:
    run = Booking.objects.create(slot=slot)
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


@csrf_exempt
@deduplicate_webhook(body_id=stripe_event_id)  # the docs' Stripe recipe
def stripe_receiver(request: HttpRequest, token: str) -> HttpResponse:
    return _run("stripe-run")


@csrf_exempt
@deduplicate_webhook(id_header="svix-id")
def svix_receiver(request: HttpRequest, token: str) -> HttpResponse:
    return _run("svix-run")


@csrf_exempt
@deduplicate_webhook(id_header="webhook-id")
def tenant_receiver(request: HttpRequest, tenant: str) -> HttpResponse:
    return _run(f"tenant-run-{tenant}")


class ApiClient:
    """A user object that is not a model (an API key's client)."""

    is_authenticated = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


#: Another module's class of the same name: 0.1 named both "ApiClient:<pk>".
PartnerApiClient = type("ApiClient", (ApiClient,), {"__module__": "tests.partner_auth"})


def tenant_user(alias: str) -> User:
    """User 1 of a tenant database (only its name matters here: nothing is queried)."""
    user = User(pk=1, username=f"owner-of-{alias}")
    user._state.db = alias
    return user


class HeaderAuthentication(BaseAuthentication):
    """Whoever ``X-Client`` names: the principals issue 24 found colliding."""

    def authenticate(self, request: Any) -> tuple[Any, None] | None:
        users = {
            "ours": lambda: ApiClient(7),
            "partner": lambda: PartnerApiClient(7),
            "tenant-a": lambda: tenant_user("tenant_a"),
            "tenant-b": lambda: tenant_user("tenant_b"),
        }
        kind = request.META.get("HTTP_X_CLIENT")
        return (users[kind](), None) if kind in users else None


@api_view(["POST"])
@authentication_classes([HeaderAuthentication])
@permission_classes([AllowAny])
@idempotent
def client_invoice(request: Any) -> Response:
    invoice = Booking.objects.create(slot=f"invoice-{request.META['HTTP_X_CLIENT']}")
    return Response({"id": invoice.pk, "iban": f"IBAN-of-{request.META['HTTP_X_CLIENT']}"}, 201)


def api_key_scope(request: HttpRequest) -> Scope | None:
    """A scope that names anonymous clients: the middleware cannot tell who they are."""
    api_key = request.headers.get("X-Api-Key")
    return Scope(principal=f"api-key:{api_key}") if api_key else None


@idempotent(scope=api_key_scope)
def api_key_upload(request: HttpRequest) -> HttpResponse:
    attachment = request.FILES["attachment"]
    assert isinstance(attachment, UploadedFile)
    upload = Booking.objects.create(slot=f"upload-{len(attachment.read())}")
    return JsonResponse({"id": upload.pk}, status=201)


urlpatterns = [
    path("sec/upload/", api_key_upload),
    path("sec/stripe/<str:token>/", stripe_receiver),
    path("sec/svix/<str:token>/", svix_receiver),
    path("tenants/<slug:tenant>/hooks/", tenant_receiver),
    path("sec/invoices/", client_invoice),
    path("", include("tests.urls")),
]

here = pytest.mark.urls(__name__)
docs_here = pytest.mark.urls("tests.docs_examples.urls")


def runs(prefix: str) -> int:
    return Booking.objects.filter(slot__startswith=prefix).count()


# -- 1. a receiver trusts the one id it names --------------------------------------


def standard_headers(msg_id: str, body: bytes) -> dict[str, Any]:
    now = int(time.time())
    return {
        "HTTP_WEBHOOK_ID": msg_id,
        "HTTP_WEBHOOK_TIMESTAMP": str(now),
        "HTTP_WEBHOOK_SIGNATURE": sign(WEBHOOK_SECRET, msg_id, now, body),
    }


EXTRA_HEADERS: list[dict[str, Any]] = [
    {"HTTP_IDEMPOTENCY_KEY": "attacker-1"},
    {"HTTP_SVIX_ID": "attacker-2"},
    {"HTTP_X_GITHUB_DELIVERY": "attacker-3"},
    {"HTTP_X_SHOPIFY_WEBHOOK_ID": "attacker-4"},
    {"HTTP_I_TWILIO_IDEMPOTENCY_TOKEN": "attacker-5"},
]


@pytest.mark.django_db
@docs_here
def test_a_captured_standard_webhook_with_an_extra_header_is_still_a_duplicate(
    client: Client,
) -> None:
    """0d3b924: ``Idempotency-Key`` (and each registry header) won over the signed webhook-id."""
    body = b'{"type": "invoice.paid"}'
    captured = standard_headers("msg_1", body)
    url = "/hooks/standard/trg_1/"
    assert client.post(url, body, "application/json", **captured).json()["status"] == "accepted"
    for extra in EXTRA_HEADERS:
        replayed = client.post(url, body, "application/json", **captured, **extra)
        assert replayed.json() == {"status": "duplicate"}, extra
    assert runs("standard-webhook-run") == 1


@pytest.mark.django_db
@here
def test_a_captured_stripe_event_with_a_provider_header_is_still_a_duplicate(
    client: Client,
) -> None:
    """0d3b924: any registry header (X-GitHub-Delivery) won over the event id in the body."""
    event = json.dumps({"id": "evt_1001", "object": "event", "type": "charge.succeeded"})
    url = "/sec/stripe/trg_s/"
    assert client.post(url, event, "application/json").json()["status"] == "accepted"
    for extra in [*EXTRA_HEADERS, {"HTTP_WEBHOOK_ID": "attacker-6"}]:
        assert client.post(url, event, "application/json", **extra).json() == {
            "status": "duplicate"
        }
    assert runs("stripe-run") == 1


@pytest.mark.django_db
@here
def test_a_svix_receiver_ignores_webhook_id(client: Client) -> None:
    """0d3b924: webhook-id came before svix-id in the registry, so it won."""
    url = "/sec/svix/trg_v/"
    assert client.post(url, "{}", "application/json", HTTP_SVIX_ID="msg_v").json()["status"] == (
        "accepted"
    )
    again = client.post(url, "{}", "application/json", HTTP_SVIX_ID="msg_v", HTTP_WEBHOOK_ID="x")
    assert again.json() == {"status": "duplicate"}
    missing = client.post(url, "{}", "application/json", HTTP_WEBHOOK_ID="msg_v")
    assert missing.status_code == 400
    assert missing["Content-Type"] == "application/problem+json"
    assert missing.json()["code"] == "webhook_delivery_id_missing"
    assert runs("svix-run") == 1


def test_a_receiver_names_one_id_only() -> None:
    with pytest.raises(TypeError):
        deduplicate_webhook(id_header="svix-id", body_id=stripe_event_id)


# -- 2. one namespace per tenant ----------------------------------------------------


@pytest.mark.django_db
@here
def test_tenants_receivers_do_not_share_delivery_ids(client: Client) -> None:
    """0d3b924: a receiver without a ``token`` kwarg had the namespace "" for every tenant."""

    def deliver(tenant: str) -> Any:
        url = f"/tenants/{tenant}/hooks/"
        return client.post(url, "{}", "application/json", HTTP_WEBHOOK_ID="evt_1001").json()

    assert deliver("acme")["status"] == "accepted"
    assert deliver("globex")["status"] == "accepted"  # another tenant's own evt_1001
    assert deliver("acme") == {"status": "duplicate"}
    assert runs("tenant-run-acme") == runs("tenant-run-globex") == 1
    assert len({d.principal for d in WebhookDelivery.objects.all()}) == 2


def _urlconf(*patterns: Any) -> Any:
    return type("URLConf", (), {"urlpatterns": list(patterns)})  # hashable, unlike a module path


@deduplicate_webhook(id_header="webhook-id")
def shared_receiver(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=202)


@deduplicate_webhook(id_header="webhook-id", namespace="billing")
def named_receiver(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=202)


@api_view(["POST"])
@deduplicate_webhook(id_header="webhook-id")
def drf_shared_receiver(request: Any) -> Response:
    return Response(status=202)


def test_a_receiver_without_a_namespace_is_flagged() -> None:
    """0d3b924 had no such check."""

    def flagged(*patterns: Any) -> list[str]:
        with override_settings(ROOT_URLCONF=_urlconf(*patterns)):
            return [m.msg for m in check_receiver_namespaces() if str(m.id).endswith("W030")]

    assert len(flagged(path("hooks/", shared_receiver))) == 1
    assert len(flagged(path("api/", include([path("drf-hooks/", drf_shared_receiver)])))) == 1
    assert flagged(path("hooks/", named_receiver)) == []
    assert flagged(path("hooks/<str:token>/", shared_receiver)) == []
    assert flagged(path("<slug:tenant>/", include([path("hooks/", shared_receiver)]))) == []
    assert flagged(path("hooks/", shared_receiver, {"tenant": "acme"})) == []
    # Registered: manage.py check runs it.
    with override_settings(ROOT_URLCONF=_urlconf(path("hooks/", shared_receiver))):
        assert "idempotency_django.W030" in {m.id for m in checks.run_checks()}


# -- 3. bodies: only what will be fingerprinted, capped, deleted ---------------------


BIG = b"x" * (64 * 1024)


@pytest.fixture
def temp_dir(tmp_path: Path) -> Iterator[Path]:
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=4096, FILE_UPLOAD_TEMP_DIR=str(tmp_path)):
        yield tmp_path


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "status"),
    [("/no/such/page/", 404), ("/api/bookings/", 403), ("/plain/bookings/", 403)],
)
def test_an_anonymous_keyed_body_is_not_copied(temp_dir: Path, url: str, status: int) -> None:
    """0d3b924 copied every keyed body to disk before URL resolution and authentication."""
    client = Client(enforce_csrf_checks=True)
    response = client.post(url, BIG, "application/octet-stream", HTTP_IDEMPOTENCY_KEY="anon")
    assert response.status_code == status
    assert not hasattr(response.wsgi_request, BODY_COPY_ATTRIBUTE)
    assert list(temp_dir.iterdir()) == []


@pytest.mark.django_db
def test_the_copy_is_deleted_when_the_response_is_closed(
    alice_client: Client, temp_dir: Path
) -> None:
    """0d3b924 left it until the request was garbage-collected (here: kept by the response)."""
    upload = SimpleUploadedFile("scan.bin", BIG)
    response = alice_client.post(
        "/plain/form/", {"slot": "s", "attachment": upload}, HTTP_IDEMPOTENCY_KEY="big"
    )
    assert response.status_code == 201, response.content[:200]
    assert hasattr(response.wsgi_request, BODY_COPY_ATTRIBUTE)  # it was copied...
    assert list(temp_dir.iterdir()) == []  # ...and is gone with the response


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/plain/bookings/", "/api/bookings/"])
def test_a_keyed_body_over_the_limit_is_413_and_never_read(alice_client: Client, url: str) -> None:
    """0d3b924 had no limit: it read (and spooled) bodies of any size."""
    with override_settings(IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 1000}):
        response = alice_client.post(
            url, b"{" + b" " * 2000 + b"}", "application/json", HTTP_IDEMPOTENCY_KEY="huge"
        )
    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_body_too_large"
    assert not response.wsgi_request._read_started  # type: ignore[attr-defined]
    assert Booking.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/plain/bookings/", "/api/bookings/"])
def test_with_the_protection_off_a_keyed_body_is_not_looked_at(
    alice_client: Client, url: str
) -> None:
    """``ENABLED=False``: keyed requests run as if they carried no key, so no 413 either."""
    body = json.dumps({"slot": "2026-08-05T09:00:00Z", "customer": "alice"}) + " " * 2000
    with override_settings(IDEMPOTENCY={"ENABLED": False, "MAX_FINGERPRINTED_BODY": 1000}):
        answers = [
            alice_client.post(url, body, "application/json", HTTP_IDEMPOTENCY_KEY="off")
            for _ in range(2)
        ]
    assert [answer.status_code for answer in answers] == [201, 201], answers[0].content[:200]
    assert Booking.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize(
    ("content_type", "length", "kept"),
    [
        ("application/json", "20", True),
        ("application/x-www-form-urlencoded", "20", True),
        ("application/json", None, False),  # chunked under ASGI: nothing bounds the read
        ("application/json", "", False),
        ("application/json", "-1", False),
        ("application/json", "1001", False),  # over MAX_FINGERPRINTED_BODY
        ("application/json", "2000001", False),  # over DATA_UPLOAD_MAX_MEMORY_SIZE
        ("multipart/form-data; boundary=x", "20", False),  # an upload: copied, not kept
    ],
)
def test_which_bodies_are_read_before_the_principal_is_known(
    content_type: str, length: str | None, kept: bool
) -> None:
    """A body that ``request.body`` holds in memory is read whoever sent it; any other is
    copied only for a request that can be scoped."""
    request = RequestFactory().post("/", b"{}", content_type=content_type)
    if length is None:
        del request.META["CONTENT_LENGTH"]
    else:
        request.META["CONTENT_LENGTH"] = length
    limits = {"IDEMPOTENCY": {"MAX_FINGERPRINTED_BODY": 1000}}
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2_000_000, **limits):
        assert kept_by_django(request) is kept


@pytest.mark.django_db
@here
def test_a_view_with_its_own_scope_still_gets_its_body_copied(temp_dir: Path) -> None:
    """Its scope may name an anonymous client, so the body is readied before CSRF reads it."""
    client = Client(enforce_csrf_checks=True)
    secret = "a" * 32
    client.cookies["csrftoken"] = secret

    def send() -> Any:
        data = {"csrfmiddlewaretoken": secret, "attachment": SimpleUploadedFile("a.bin", BIG)}
        return client.post("/sec/upload/", data, HTTP_IDEMPOTENCY_KEY="up", HTTP_X_API_KEY="k1")

    first = send()
    assert first.status_code == 201, first.content[:300]
    assert send()["Idempotency-Replayed"] == "true"
    assert runs("upload-") == 1
    assert list(temp_dir.iterdir()) == []


def test_the_body_limit_is_a_checked_setting() -> None:
    assert DEFAULTS["MAX_FINGERPRINTED_BODY"] == 10 * 1024 * 1024
    with override_settings(IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": -1}):
        assert "idempotency_django.E024" in {m.id for m in check_settings()}


# -- 4. one principal cannot fill the store -----------------------------------------


@pytest.mark.django_db
def test_a_principal_holds_as_many_keys_as_it_sends_by_default(
    alice_client: Client, alice: User
) -> None:
    """Issue 36: the limit refused an ordinary integration's 1,001st write of the day."""
    assert DEFAULTS["MAX_KEYS_PER_PRINCIPAL"] is None
    hold_keys(alice, 1000)
    response = alice_client.post(
        "/plain/bookings/", "{}", "application/json", HTTP_IDEMPOTENCY_KEY="one-more"
    )
    assert response.status_code == 201
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_a_principal_holds_at_most_max_keys_when_set(alice_client: Client, alice: User) -> None:
    """0d3b924: no limit at all; an API open to sign-ups sets one."""
    hold_keys(alice, 1000)
    with override_settings(IDEMPOTENCY={"MAX_KEYS_PER_PRINCIPAL": 1000}):
        response = alice_client.post(
            "/plain/bookings/", "{}", "application/json", HTTP_IDEMPOTENCY_KEY="one-more"
        )
    assert response.status_code == 429
    assert response.json()["code"] == "idempotency_too_many_keys"
    assert int(response["Retry-After"]) > 0
    assert Booking.objects.count() == 0


def hold_keys(user: User, count: int) -> None:
    """``count`` live keys of ``user``, claimed in the store directly."""
    store = get_store()
    info = RequestInfo("POST", "/plain/bookings/", "f")
    for number in range(count):
        store.claim(RecordKey(f"auth.user:{user.pk}", "", f"k{number}"), info, 300)


@pytest.mark.parametrize(
    ("policy", "flagged"),
    [
        ("noeviction", False),
        ("volatile-lru", True),  # every record has a TTL: all of them may go
        ("volatile-ttl", True),
        ("allkeys-lru", True),
    ],
)
def test_a_redis_server_that_evicts_records_is_flagged(policy: str, flagged: bool) -> None:
    """0d3b924 had no such check."""
    import redis

    with private_redis_server() as (_process, port):
        server = redis.Redis(port=port)
        server.config_set("maxmemory", "48mb")
        server.config_set("maxmemory-policy", policy)
        server.close()
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))
        store = {"STORE": "redis", "STORE_OPTIONS": {"cache": "private"}}
        with override_settings(CACHES=caches, IDEMPOTENCY=store):
            get_store.cache_clear()
            try:
                ids = {m.id for m in check_settings()}
            finally:
                get_store.cache_clear()
    assert ("idempotency_django.W022" in ids) is flagged


def test_a_redis_server_without_maxmemory_evicts_nothing() -> None:
    with private_redis_server() as (_process, port):
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))
        store = {"STORE": "redis", "STORE_OPTIONS": {"cache": "private"}}
        with override_settings(CACHES=caches, IDEMPOTENCY=store):
            get_store.cache_clear()
            try:
                assert "idempotency_django.W022" not in {m.id for m in check_settings()}
            finally:
                get_store.cache_clear()


# -- 5. principals nobody else shares -----------------------------------------------


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest, db: None) -> Iterator[str]:
    if request.param == "redis":
        with redis_store_settings():
            yield "redis"
    else:
        yield "database"


def invoice(client: Client, who: str, key: str = "inv-1") -> Any:
    return client.post(
        "/sec/invoices/", {"amount": 10}, "application/json", HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_CLIENT=who,
    )  # fmt: skip


@here
@pytest.mark.parametrize(("one", "other"), [("ours", "partner"), ("tenant-a", "tenant-b")])
def test_two_principals_of_the_same_name_never_share_an_answer(
    client: Client, store: str, one: str, other: str
) -> None:
    """0d3b924: both were "ApiClient:7" (or "auth.user:1"): the second got the first's IBAN."""
    first, second = invoice(client, one), invoice(client, other)
    assert first.status_code == second.status_code == 201
    assert "Idempotency-Replayed" not in second
    assert second.json()["iban"] == f"IBAN-of-{other}"
    assert invoice(client, one)["Idempotency-Replayed"] == "true"


def write_the_0_2_way(principal: str, key: str, path_: str, body: bytes, answer: bytes) -> None:
    """A record as 0d3b924 wrote it: its principal name and a plain SHA-256 fingerprint."""
    fingerprint = hashlib.sha256(b"POST\n" + path_.encode() + b"\n" + body).hexdigest()
    store = get_store()
    record = RecordKey(principal, "", key)
    claim = store.claim(record, RequestInfo("POST", path_, fingerprint), 300)
    stored = StoredResponse(201, (("Content-Type", "application/json"),), answer)
    assert store.complete(record, claim.token, stored, 3600)


@here
def test_records_written_by_0_1_keep_replaying(client: Client, store: str) -> None:
    """Upgrade: a retry of a request 0.1 stored is answered from that record."""
    body = json.dumps({"amount": 10}).encode()
    write_the_0_2_way("ApiClient:7", "inv-old", "/sec/invoices/", body, b'{"id": 99}')
    replay = invoice(client, "ours", key="inv-old")
    assert replay["Idempotency-Replayed"] == "true" and replay.json() == {"id": 99}
    assert runs("invoice-") == 0


@pytest.mark.django_db
def test_a_default_database_users_0_2_record_keeps_replaying(
    alice_client: Client, alice: User, store: str
) -> None:
    body = json.dumps({"slot": "a"}).encode()
    principal = f"auth.user:{alice.pk}"
    write_the_0_2_way(principal, "old", "/plain/bookings/", body, b'{"id": 42}')
    replay = alice_client.post(
        "/plain/bookings/", body, "application/json", HTTP_IDEMPOTENCY_KEY="old"
    )
    assert replay["Idempotency-Replayed"] == "true" and replay.json() == {"id": 42}
    other = alice_client.post(
        "/plain/bookings/", b'{"slot": "b"}', "application/json", HTTP_IDEMPOTENCY_KEY="old"
    )
    assert other.status_code == 409  # a 0.1 record still tells another body apart


# -- 6. digests keyed with the server's secret --------------------------------------


@pytest.mark.django_db
def test_a_fingerprint_cannot_be_recomputed_without_the_secret(alice_client: Client) -> None:
    """0d3b924 stored SHA-256(method, path, body): a 6-digit PIN came back in a second."""
    body = b'{"pin": "482913"}'
    alice_client.post("/plain/bookings/", body, "application/json", HTTP_IDEMPOTENCY_KEY="pin")
    stored = IdempotencyRecord.objects.get().fingerprint
    message = b"POST\n/plain/bookings/\n" + body
    assert stored != hashlib.sha256(message).hexdigest()
    assert stored == salted_hmac(FINGERPRINT_SALT, message, algorithm="sha256").hexdigest()


OLD_KEY, NEW_KEY = "the-old-secret-key-" + "x" * 40, "the-new-secret-key-" + "y" * 40


@here
def test_fingerprints_follow_secret_key_fallbacks(client: Client, store: str) -> None:
    with override_settings(SECRET_KEY=OLD_KEY):
        assert invoice(client, "ours", key="rot").status_code == 201
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[OLD_KEY]):
        assert invoice(client, "ours", key="rot")["Idempotency-Replayed"] == "true"
    with override_settings(SECRET_KEY=NEW_KEY, SECRET_KEY_FALLBACKS=[]):
        # Nothing links the two: refused as another request, never run twice.
        assert invoice(client, "ours", key="rot").json()["code"] == "idempotency_key_reused"
    assert runs("invoice-") == 1


@pytest.mark.django_db
def test_a_webhook_fallback_id_cannot_be_recomputed_without_the_secret(client: Client) -> None:
    """0d3b924 stored SHA-256 of the token, the bucket and the body as the delivery's key."""
    token, body = "trg_20bit", b'{"amount": 1}'
    client.post(f"/hooks/fallback/{token}/", body, "application/json")
    _fallback, bucket, digest = WebhookDelivery.objects.get().key.split(":")
    plain = hashlib.sha256()
    for part in (token.encode(), bucket.encode(), body):
        plain.update(len(part).to_bytes(8, "big"))
        plain.update(part)
    assert digest != plain.hexdigest()
    assert base64.b16decode(digest.upper())  # still a 256-bit hex digest
    assert len(digest) == 64
