"""Webhook delivery deduplication: identity sources, buckets, expiry, failures, secrets."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.response import Response

from idempotency_django.models import IdempotencyRecord, WebhookDelivery
from idempotency_django.protocol.scope import Scope, default_scope
from idempotency_django.stores import get_store
from idempotency_django.webhooks import deduplicate_webhook
from idempotency_django.webhooks import identity as identity_module
from idempotency_django.webhooks.identity import (
    FALLBACK_BUCKET,
    TRIGGER_PREFIX,
    DeliveryIdentity,
    fallback_identity,
    trigger_digest,
)
from tests.checkpoints import Checkpoint
from tests.concurrency import Background, in_threads
from tests.redis_helpers import redis_store_settings
from tests.testapp.models import Booking

TOKEN = "trg_9f8e7d6c5b4a-secret-token"
URL = f"/hooks/{TOKEN}/"
#: A receiver that names no delivery id: the settings' or the fallback.
FALLBACK_URL = f"/hooks/fallback/{TOKEN}/"
BODY = json.dumps({"event": "order.paid", "order": 4471})


def deliver(client: Client, url: str = URL, body: str = BODY, **headers: Any):  # type: ignore[no-untyped-def]
    return client.post(url, body, content_type="application/json", **headers)


def runs() -> int:
    return Booking.objects.filter(slot__endswith="webhook-run").count()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "header", "source"),
    [
        ("Idempotency-Key", "HTTP_IDEMPOTENCY_KEY", "idempotency-key"),
        ("webhook-id", "HTTP_WEBHOOK_ID", "standard-webhooks"),
        ("svix-id", "HTTP_SVIX_ID", "svix"),
        ("X-GitHub-Delivery", "HTTP_X_GITHUB_DELIVERY", "github"),
        ("X-Shopify-Webhook-Id", "HTTP_X_SHOPIFY_WEBHOOK_ID", "shopify"),
        ("X-Shopify-Event-Id", "HTTP_X_SHOPIFY_EVENT_ID", "shopify"),
        ("I-Twilio-Idempotency-Token", "HTTP_I_TWILIO_IDEMPOTENCY_TOKEN", "twilio"),
        ("X-Paddle-Event-Id", "HTTP_X_PADDLE_EVENT_ID", "header"),
    ],
)
def test_each_delivery_header_deduplicates(
    client: Client, name: str, header: str, source: str
) -> None:
    with override_settings(IDEMPOTENCY={"WEBHOOK_ID_HEADER": name}):
        _deduplicates_by(client, header, source)


def _deduplicates_by(client: Client, header: str, source: str) -> None:
    def deliver(client: Client, body: str = BODY, **headers: Any):  # type: ignore[no-untyped-def]
        return client.post(FALLBACK_URL, body, content_type="application/json", **headers)

    first = deliver(client, **{header: "delivery-1"})
    assert first.status_code == 202
    assert first.json()["status"] == "accepted"
    duplicate = deliver(client, body='{"different": "body"}', **{header: "delivery-1"})
    assert duplicate.status_code == 202
    assert duplicate.json() == {"status": "duplicate"}
    assert "run_id" not in duplicate.json()
    assert runs() == 1
    delivery = WebhookDelivery.objects.get()
    assert delivery.key == "delivery-1"
    assert delivery.source == source
    assert json.loads(bytes(delivery.response_body))["run_id"] == str(first.json()["run_id"])
    assert deliver(client, **{header: "delivery-2"}).json()["status"] == "accepted"
    assert runs() == 2


@pytest.mark.django_db
def test_only_the_named_header_counts(client: Client) -> None:
    deliver(client, HTTP_IDEMPOTENCY_KEY="k", HTTP_WEBHOOK_ID="a")
    assert (
        deliver(client, HTTP_IDEMPOTENCY_KEY="k", HTTP_WEBHOOK_ID="b").json()["status"]
        == "accepted"
    )
    assert deliver(client, HTTP_IDEMPOTENCY_KEY="z", HTTP_WEBHOOK_ID="a").json() == {
        "status": "duplicate"
    }


@pytest.mark.django_db
def test_a_missing_named_header_is_400_and_nothing_runs(client: Client) -> None:
    response = deliver(client, HTTP_SVIX_ID="a")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "webhook_delivery_id_missing"
    assert runs() == 0


@pytest.mark.django_db
@override_settings(
    IDEMPOTENCY={"WEBHOOK_BODY_ID_FUNCTION": "idempotency_django.webhooks.stripe_event_id"}
)
def test_body_id_hook_reads_stripe_event_id(client: Client) -> None:
    event = {"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": "charge.succeeded"}
    deliver(client, FALLBACK_URL, body=json.dumps(event))
    retried = {**event, "request": {"retry": 1}}
    assert deliver(client, FALLBACK_URL, body=json.dumps(retried)).json()["status"] == "duplicate"
    assert WebhookDelivery.objects.get().source == "body"


@pytest.mark.django_db
@override_settings(
    IDEMPOTENCY={"WEBHOOK_BODY_ID_FUNCTION": "idempotency_django.webhooks.stripe_event_id"}
)
def test_a_body_nested_too_deep_for_the_json_parser_falls_back(client: Client) -> None:
    """``json.loads`` raises RecursionError, not ValueError, on a deeply nested body:
    stripe_event_id let it through, a 500 on a sender's (or anyone's) body."""
    nested = "[" * 100_000 + "]" * 100_000
    assert deliver(client, FALLBACK_URL, body=nested).json()["status"] == "accepted"
    assert deliver(client, FALLBACK_URL, body=nested).json() == {"status": "duplicate"}
    assert WebhookDelivery.objects.get().source == "fallback"


@pytest.mark.django_db
def test_fallback_hash_catches_a_short_retry(client: Client) -> None:
    deliver(client, FALLBACK_URL)
    assert deliver(client, FALLBACK_URL).json()["status"] == "duplicate"
    assert deliver(client, FALLBACK_URL, body='{"other": 1}').json()["status"] == "accepted"
    delivery = WebhookDelivery.objects.order_by("pk").first()
    assert delivery is not None and delivery.source == "fallback"
    assert TOKEN not in delivery.key and BODY not in delivery.key


BOUNDARY = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)  # a multiple of 300 s


@pytest.mark.django_db
def test_fallback_retry_across_a_bucket_boundary_is_caught(client: Client) -> None:
    with time_machine.travel(BOUNDARY - timedelta(seconds=1), tick=False):
        assert deliver(client, FALLBACK_URL).json()["status"] == "accepted"
    with time_machine.travel(BOUNDARY + timedelta(seconds=1), tick=False):
        assert deliver(client, FALLBACK_URL).json()["status"] == "duplicate"
    assert runs() == 1


@pytest.mark.django_db
def test_fallback_retry_through_a_server_whose_clock_is_behind_is_caught(client: Client) -> None:
    """Accepted by one app server just after a bucket edge; the sender's retry reaches
    another whose clock is a second behind, still in the bucket before: it looked in
    that one and the one before it, not in the first's, and ran the delivery again."""
    with time_machine.travel(BOUNDARY + timedelta(seconds=0.5), tick=False):
        assert deliver(client, FALLBACK_URL).json()["status"] == "accepted"
    with time_machine.travel(BOUNDARY - timedelta(seconds=0.5), tick=False):
        assert deliver(client, FALLBACK_URL).json() == {"status": "duplicate"}
    assert runs() == 1


@pytest.mark.django_db
def test_fallback_protects_short_retries_only(client: Client) -> None:
    with time_machine.travel(BOUNDARY, tick=False):
        deliver(client, FALLBACK_URL)
    with time_machine.travel(BOUNDARY + timedelta(seconds=601), tick=False):
        assert deliver(client, FALLBACK_URL).json()["status"] == "accepted"
    assert runs() == 2


def age(delivery: WebhookDelivery, by: timedelta) -> None:
    """Move a delivery back in time: the store compares expiries with the database's clock."""
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        created_at=F("created_at") - by, expires_at=F("expires_at") - by
    )


@pytest.mark.django_db
def test_accepted_identity_is_kept_seven_days(client: Client) -> None:
    deliver(client, HTTP_WEBHOOK_ID="msg_1")
    delivery = WebhookDelivery.objects.get()
    assert delivery.completed_at is not None
    assert delivery.expires_at - delivery.completed_at == timedelta(days=7)
    age(delivery, timedelta(days=7, seconds=-1))
    assert deliver(client, HTTP_WEBHOOK_ID="msg_1").json()["status"] == "duplicate"
    age(delivery, timedelta(seconds=2))
    assert deliver(client, HTTP_WEBHOOK_ID="msg_1").json()["status"] == "accepted"
    assert runs() == 2


@pytest.mark.django_db
def test_webhook_retention_is_read_as_retention_is(client: Client) -> None:
    """Not validated at each delivery: a float the checks report (E004) kept deliveries
    by before, where a check of it at each delivery would answer every one 500."""
    with override_settings(IDEMPOTENCY={"WEBHOOK_RETENTION": 3600.0}):
        assert deliver(client, HTTP_WEBHOOK_ID="msg_r").json()["status"] == "accepted"
        assert deliver(client, HTTP_WEBHOOK_ID="msg_r").json() == {"status": "duplicate"}
    delivery = WebhookDelivery.objects.get()
    assert delivery.completed_at is not None
    assert delivery.expires_at - delivery.completed_at == timedelta(hours=1)
    assert runs() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["?fail=500", "?fail=503", "?fail=401", "?raise=1"])
def test_failed_delivery_is_not_recorded(client: Client, query: str) -> None:
    client.raise_request_exception = False
    assert deliver(client, URL + query, HTTP_WEBHOOK_ID="msg_f").status_code >= 400
    assert WebhookDelivery.objects.count() == 0
    assert deliver(client, HTTP_WEBHOOK_ID="msg_f").json()["status"] == "accepted"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("receiver", [URL, f"/api/hooks/{TOKEN}/"], ids=["view", "DRF"])
@pytest.mark.parametrize("status", [400, 422, 500])
def test_a_delivery_refused_after_its_writes_commits_none_of_them(
    client: Client, receiver: str, status: int
) -> None:
    """Under ATOMIC_REQUESTS a refused delivery is not recorded, so the sender's retry
    runs the view again: its writes must not commit either. A 4xx committed them (only a
    5xx rolled back), and every retry of a refused event wrote them once more."""
    headers = {"HTTP_WEBHOOK_ID": "msg_w", "HTTP_SVIX_ID": "msg_w"}
    assert deliver(client, f"{receiver}?refuse={status}", **headers).status_code == status
    assert deliver(client, f"{receiver}?refuse={status}", **headers).status_code == status
    assert Booking.objects.count() == 0
    assert deliver(client, receiver, **headers).json()["status"] == "accepted"
    assert deliver(client, receiver, **headers).json() == {"status": "duplicate"}
    assert Booking.objects.count() == 1


@pytest.mark.django_db
def test_triggers_are_separate_scopes(client: Client) -> None:
    deliver(client, HTTP_WEBHOOK_ID="msg_1")
    assert (
        deliver(client, "/hooks/another-token/", HTTP_WEBHOOK_ID="msg_1").json()["status"]
        == "accepted"
    )


@pytest.mark.django_db
def test_a_url_argument_converted_to_an_object_gives_a_stable_namespace(client: Client) -> None:
    """A path converter's object without a ``__str__`` of its own was named in the
    namespace by its default repr, with its address, new at every request: the same
    delivery ran at every retry."""
    url = f"/tenants/acme/hooks/{TOKEN}/"
    assert deliver(client, url, HTTP_WEBHOOK_ID="msg_t").json()["status"] == "accepted"
    assert deliver(client, url, HTTP_WEBHOOK_ID="msg_t").json() == {"status": "duplicate"}
    other = f"/tenants/globex/hooks/{TOKEN}/"
    assert deliver(client, other, HTTP_WEBHOOK_ID="msg_t").json()["status"] == "accepted"
    assert runs() == 2
    assert TOKEN not in repr(list(WebhookDelivery.objects.values()))


@pytest.mark.django_db
def test_in_progress_delivery_gets_409_with_retry_after(client: Client) -> None:
    WebhookDelivery.objects.create(
        kind="webhook",
        principal=TRIGGER_PREFIX + trigger_digest("hooks/<str:token>/", TOKEN),
        key="msg_busy",
        fingerprint="",
        method="POST",
        path="hooks/<str:token>/",
        state="in_progress",
        token="another-worker",
        expires_at=datetime.now(UTC) + timedelta(seconds=300),
    )
    response = deliver(client, HTTP_WEBHOOK_ID="msg_busy")
    assert response.status_code == 409
    assert response.json()["code"] == "webhook_delivery_in_progress"
    assert response["Retry-After"] == "1"
    assert runs() == 0


@pytest.mark.django_db
def test_drf_receiver(client: Client) -> None:
    url = f"/api/hooks/{TOKEN}/"
    assert deliver(client, url, HTTP_SVIX_ID="msg_d").json()["status"] == "accepted"
    assert deliver(client, url, HTTP_SVIX_ID="msg_d").json() == {"status": "duplicate"}
    assert Booking.objects.filter(slot="drf-webhook-run").count() == 1
    remaining = WebhookDelivery.objects.get().expires_at - datetime.now(UTC)
    assert timedelta(minutes=59) < remaining <= timedelta(hours=1)


@pytest.mark.django_db
@override_settings(IDEMPOTENCY={"WEBHOOK_ID_HEADER": "Idempotency-Key"})
def test_invalid_idempotency_key_is_400(client: Client) -> None:
    response = deliver(client, FALLBACK_URL, HTTP_IDEMPOTENCY_KEY="x" * 300)
    assert response.status_code == 400
    assert runs() == 0


@pytest.mark.django_db
def test_a_delivery_over_the_memory_limit_is_deduplicated(client: Client, settings: Any) -> None:
    """The fallback hashes a body larger than DATA_UPLOAD_MAX_MEMORY_SIZE from a copy
    on disk; ``request.body`` refused it: Django's 400 page, not a problem (before)."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    large = json.dumps({"event": "export.ready", "rows": ["x" * 100] * 50})
    assert deliver(client, FALLBACK_URL, body=large).json()["status"] == "accepted"
    assert deliver(client, FALLBACK_URL, body=large).json() == {"status": "duplicate"}
    other = large.replace("export.ready", "export.failed")
    assert deliver(client, FALLBACK_URL, body=other).json()["status"] == "accepted"
    assert runs() == 2


MULTIPART = {
    "signature": "5f2c...",
    "token": "c5a0f4f6d2a8e7",
    "body-plain": "Hello",
}


@pytest.mark.django_db
def test_a_form_parsed_before_the_fallback_is_refused_as_a_problem(client: Client) -> None:
    """A verifier above the receiver read a multipart ``request.POST``: no raw body is
    left to hash. Refused as a problem, nothing run (before: ``RawPostDataException``,
    a 500 on every delivery); with an id the form carries (``body_id``) it works."""
    client.raise_request_exception = False
    refused = client.post(f"/hooks/form/{TOKEN}/", MULTIPART)
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "idempotency_body_unavailable"
    assert runs() == 0
    url = f"/hooks/form-token/{TOKEN}/"
    assert client.post(url, MULTIPART).json()["status"] == "accepted"
    assert client.post(url, MULTIPART).json() == {"status": "duplicate"}
    assert runs() == 1


@pytest.mark.django_db(transaction=True)
def test_store_unavailable_is_503_and_nothing_runs(client: Client) -> None:
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_gone")
    try:
        response = deliver(client, HTTP_WEBHOOK_ID="msg_u")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_gone RENAME TO {table}")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"  # RETRY_AFTER
    assert runs() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_deliveries_run_once() -> None:
    clients = [Client() for _ in range(12)]
    responses = in_threads(
        len(clients), lambda i: deliver(clients[i], URL + "?delay=0.2", HTTP_WEBHOOK_ID="msg_c")
    )
    assert not [r for r in responses if isinstance(r, BaseException)]
    statuses = sorted(r.status_code for r in responses)
    assert all(s in (202, 409) for s in statuses), statuses
    accepted = [r for r in responses if r.status_code == 202 and r.json()["status"] == "accepted"]
    assert len(accepted) == 1
    assert runs() == 1


@pytest.mark.django_db
def test_no_token_url_or_body_is_stored_or_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="idempotency_django"):
        deliver(client, FALLBACK_URL)
        deliver(client, FALLBACK_URL)
        deliver(client, HTTP_WEBHOOK_ID="msg_s")
    assert "duplicate" in caplog.text
    assert TOKEN not in caplog.text and URL not in caplog.text and "order.paid" not in caplog.text
    assert FALLBACK_URL not in caplog.text
    for row in IdempotencyRecord.objects.values():
        dumped = repr(row)
        assert TOKEN not in dumped
        assert "order.paid" not in dumped


@pytest.mark.django_db(transaction=True)
def test_redis_store_deduplicates_deliveries_once_under_concurrency() -> None:
    from tests.redis_helpers import raw_client, raw_value, redis_store_settings

    with redis_store_settings():
        clients = [Client() for _ in range(12)]
        responses = in_threads(
            len(clients),
            lambda i: deliver(clients[i], URL + "?delay=0.2", HTTP_WEBHOOK_ID="msg_r"),
        )
        assert not [r for r in responses if isinstance(r, BaseException)]
        accepted = [
            r for r in responses if r.status_code == 202 and r.json()["status"] == "accepted"
        ]
        assert len(accepted) == 1
        assert all(r.status_code in (202, 409) for r in responses)
        assert deliver(Client(), HTTP_WEBHOOK_ID="msg_r").json() == {"status": "duplicate"}
        # The fallback's previous-bucket check works on Redis too.
        with time_machine.travel(BOUNDARY - timedelta(seconds=1), tick=False):
            assert deliver(Client(), FALLBACK_URL).json()["status"] == "accepted"
        with time_machine.travel(BOUNDARY + timedelta(seconds=1), tick=False):
            assert deliver(Client(), FALLBACK_URL).json()["status"] == "duplicate"
        stored = b"".join(raw_value(raw_client(), key) for key in raw_client().keys("*"))
        assert TOKEN.encode() not in stored
        assert b"order.paid" not in stored
        ttls = [raw_client().ttl(key) for key in raw_client().keys("*")]
        assert all(6 * 86400 < ttl <= 7 * 86400 for ttl in ttls), ttls
    assert runs() == 2


@pytest.mark.django_db
def test_the_token_stays_out_of_djangos_request_log(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    # No configuration: the app puts RedactTriggerURLs on django.request (tests/test_logs.py).
    with caplog.at_level(logging.WARNING, logger="django.request"):
        deliver(client, URL + "?fail=400", HTTP_WEBHOOK_ID="msg_l")
        client.post("/plain/bookings/?status=400", "{}", content_type="application/json")
    messages = [record.getMessage() for record in caplog.records]
    assert "Bad Request: hooks/<str:token>/" in messages
    assert "Bad Request: /plain/bookings/" in messages  # other views keep their path
    assert TOKEN not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_async_receiver_runs_each_delivery_once(async_client: AsyncClient) -> None:
    async def deliver_async() -> Any:
        return await async_client.post(
            f"/hooks/async/{TOKEN}/",
            BODY,
            content_type="application/json",
            headers={"webhook-id": "a1"},
        )

    first, second = async_to_sync(deliver_async)(), async_to_sync(deliver_async)()
    assert first.status_code == 202 and first.json()["status"] == "accepted"
    assert second.status_code == 202 and second.json() == {"status": "duplicate"}
    assert Booking.objects.filter(slot="async-webhook-run").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("headers", [{"HTTP_WEBHOOK_ID": "msg_rotated"}, {}])
def test_deliveries_stay_duplicates_after_a_secret_key_rotation(
    client: Client, headers: dict[str, str]
) -> None:
    """Accepted under the old SECRET_KEY, found again once it is in SECRET_KEY_FALLBACKS."""
    url = URL if headers else FALLBACK_URL
    with override_settings(SECRET_KEY="the-old-secret-key-" + "x" * 40):
        assert deliver(client, url, **headers).json()["status"] == "accepted"
    rotated = {"SECRET_KEY": "the-new-secret-key-" + "y" * 40}
    with override_settings(**rotated, SECRET_KEY_FALLBACKS=["the-old-secret-key-" + "x" * 40]):
        assert deliver(client, url, **headers).json() == {"status": "duplicate"}
    with override_settings(**rotated, SECRET_KEY_FALLBACKS=[]):
        # Without the old key nothing links the two: the same delivery runs again.
        assert deliver(client, url, **headers).json()["status"] == "accepted"
    assert runs() == 2


def test_identities_stay_those_of_deliveries_already_accepted() -> None:
    """The digests' salts never change: another would make every accepted delivery new."""
    request = RequestFactory().post("/hooks/t/", b'{"a": 1}', content_type="application/json")
    digest = trigger_digest("hooks/<str:token>/", "trg_1", secret="pinned-secret")
    assert digest == "7ac65b9e0a7aa235ce4a70d5e77a44b9ddea051bfebd1fb21a88387b99b46744"
    fallback = fallback_identity("trg_1", request, 7, secret="pinned-secret")
    assert fallback == DeliveryIdentity(
        "fallback:7:00aff82542aa9fa8729dad718b8fde4b9c333ca55c1e190ed8c322c9a2eed2b5", "fallback"
    )


# -- receivers whose answer is not rendered yet; a delivery that lost its reservation --


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
@deduplicate_webhook(id_header="webhook-id")
def drf_receiver_without_data(request: Any, token: str) -> Response:
    Booking.objects.create(slot="drf-webhook-run")
    return Response(status=204)  # accepted, nothing to say: DRF renders it after this


@deduplicate_webhook(id_header="webhook-id")
def template_receiver(request: HttpRequest, token: str) -> HttpResponse:
    Booking.objects.create(slot="template-webhook-run")
    return TemplateResponse(request, engines["django"].from_string("ok"))


def delivery(delivery_id: str) -> HttpRequest:
    return RequestFactory().post("/hooks/t/", BODY, "application/json", HTTP_WEBHOOK_ID=delivery_id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "receiver", [drf_receiver_without_data, template_receiver], ids=["drf-no-data", "template"]
)
def test_an_answer_rendered_after_the_receiver_is_accepted_once(receiver: Any) -> None:
    """Its run id is read without rendering what cannot be rendered yet: no 500, and the
    sender's retry is a duplicate (a 500 gave the delivery back: the work ran again)."""
    first = receiver(delivery("evt-lazy"), token="t")
    assert first.status_code in (200, 204)
    again = receiver(delivery("evt-lazy"), token="t")
    assert (again.status_code, json.loads(again.content)) == (202, {"status": "duplicate"})
    assert WebhookDelivery.objects.count() == 1
    assert Booking.objects.filter(slot__endswith="webhook-run").count() == 1


@deduplicate_webhook(id_header="webhook-id")
def receiver_overtaken(request: HttpRequest, token: str) -> HttpResponse:
    """Runs past LOCK_TIMEOUT, and the sender's retry takes the delivery over meanwhile."""
    Booking.objects.create(slot="overtaken-webhook-run")
    store = get_store()
    store.now = lambda: time.monotonic() + 5  # type: ignore[attr-defined]  # past it
    assert receiver_that_runs_once(delivery("evt-lost"), token="t").status_code == 202
    return HttpResponse(json.dumps({"run_id": 1}), status=202, content_type="application/json")


@deduplicate_webhook(id_header="webhook-id")
def receiver_that_runs_once(request: HttpRequest, token: str) -> HttpResponse:
    return HttpResponse(status=202)


@pytest.mark.django_db(transaction=True)
def test_a_delivery_that_lost_its_reservation_answers_the_webhook_code() -> None:
    """Its work rolls back, and its answer is the webhook's 409, not the key contract's."""
    settings = {"STORE": "memory", "LOCK_TIMEOUT": 1}  # its clock can be moved on
    with override_settings(IDEMPOTENCY=settings), transaction.atomic():
        try:
            response = receiver_overtaken(delivery("evt-lost"), token="t")
        finally:
            vars(get_store()).pop("now", None)  # the store's own clock again
    assert response.status_code == 409
    assert json.loads(response.content)["code"] == "webhook_delivery_in_progress"
    assert Booking.objects.filter(slot="overtaken-webhook-run").count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("atomic_requests")
def test_a_retry_in_the_next_bucket_waits_for_a_first_run_not_committed_yet() -> None:
    """Under ``ATOMIC_REQUESTS`` the first delivery's reservation is not committed while it
    runs; the sender's retry lands in the next time bucket, whose key is another one. It
    finds the first's key held (PostgreSQL's lock, MariaDB's locked row), not free: 409,
    and a duplicate once the first has committed. Never a second run."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: a reservation in a transaction has no lock another can see")
    first_client, retry_client = Client(), Client()
    with time_machine.travel(BOUNDARY - timedelta(seconds=1), tick=False) as clock:
        with Checkpoint("first-delivery") as running:
            first = Background(
                lambda: deliver(first_client, FALLBACK_URL, HTTP_X_PAUSE_AT="first-delivery")
            ).start()
            running.wait_until_reached()  # claimed in its transaction, not committed
            clock.move_to(BOUNDARY + timedelta(seconds=1))
            retry = deliver(retry_client, FALLBACK_URL)
        assert first.join().json()["status"] == "accepted"
        again = deliver(retry_client, FALLBACK_URL)
    assert (retry.status_code, retry.json()["code"]) == (409, "webhook_delivery_in_progress")
    assert again.json() == {"status": "duplicate"}
    assert runs() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("refused", ["?refuse=400", "?refuse=500"])
def test_under_atomic_a_refused_delivery_keeps_none_of_its_writes(
    client: Client, refused: str
) -> None:
    """``IDEMPOTENCY["ATOMIC"]``: a receiver runs in a transaction as every protected view
    does. A delivery refused after its write (a 4xx or 5xx, not recorded) is retried by the
    sender: its write goes with it. Before, each refused attempt committed one."""
    with override_settings(IDEMPOTENCY={"ATOMIC": True}):
        assert deliver(client, URL + refused, HTTP_WEBHOOK_ID="msg_a").status_code >= 400
        assert deliver(client, URL + refused, HTTP_WEBHOOK_ID="msg_a").status_code >= 400
        assert deliver(client, URL, HTTP_WEBHOOK_ID="msg_a").json()["status"] == "accepted"
    assert runs() == 1


def tenant_scope(request: HttpRequest) -> Scope | None:
    """A project's own SCOPE_FUNCTION (the default's answer, by another function)."""
    return default_scope(request)


@pytest.mark.django_db
def test_a_large_delivery_keyed_by_idempotency_key_is_never_refused_413(client: Client) -> None:
    """``MAX_FINGERPRINTED_BODY`` is the key contract's, not a sender's: a delivery whose id
    is its ``Idempotency-Key`` header runs whatever its size. The middleware, which readied
    such a body under a project's SCOPE_FUNCTION, answered every attempt 413."""
    large = json.dumps({"event": "export.ready", "rows": ["x" * 100] * 50})
    settings = {
        "WEBHOOK_ID_HEADER": "Idempotency-Key",
        "MAX_FINGERPRINTED_BODY": 1000,
        "SCOPE_FUNCTION": f"{__name__}.tenant_scope",
    }
    with override_settings(IDEMPOTENCY=settings):
        first = deliver(client, FALLBACK_URL, body=large, HTTP_IDEMPOTENCY_KEY="evt-1")
        again = deliver(client, FALLBACK_URL, body=large, HTTP_IDEMPOTENCY_KEY="evt-1")
    assert (first.status_code, first.json()["status"]) == (202, "accepted")
    assert again.json() == {"status": "duplicate"}
    assert runs() == 1


#: Each thread's clock, for two app servers either side of a bucket's edge.
_thread_clock = threading.local()


class ThreadClock:
    def time(self) -> float:
        return getattr(_thread_clock, "now", time.time())


EDGE = 1_800_000_000 - 1_800_000_000 % FALLBACK_BUCKET  # a bucket boundary
EDGE_RUNS: list[str] = []


@deduplicate_webhook
def edge_receiver(request: HttpRequest, token: str) -> HttpResponse:
    EDGE_RUNS.append(threading.current_thread().name)
    return HttpResponse(status=202)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("store_name", ["database", "redis", "memory"])
def test_two_copies_either_side_of_a_bucket_edge_run_once(
    monkeypatch: pytest.MonkeyPatch, store_name: str
) -> None:
    """A sender that delivers at least once sends two copies of a keyless delivery at the
    same moment, through two app servers either side of a bucket's edge. B, just after
    it, looks at bucket N while A, just before it, has not claimed N yet; A claims it and
    runs. B then claims N+1: before, it ran too. Each now claims its own bucket first,
    then looks at the others: B finds A's (or A finds B's), and one copy runs."""
    EDGE_RUNS.clear()
    monkeypatch.setattr(identity_module, "time", ThreadClock())
    a_done = threading.Event()
    stores: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
        "database": contextlib.nullcontext,
        "redis": redis_store_settings,
        "memory": lambda: override_settings(IDEMPOTENCY={"STORE": "memory"}),
    }
    with stores[store_name]():
        store = get_store()
        looks_at = store.peek

        def peek(key: Any) -> Any:
            held = looks_at(key)
            if threading.current_thread().name == "B":
                a_done.wait(10)  # B has looked; A claims and runs meanwhile
            return held

        monkeypatch.setattr(store, "peek", peek)
        answers: dict[str, HttpResponse] = {}

        def deliver_at(name: str, now: float) -> None:
            _thread_clock.now = now
            try:
                request = RequestFactory().post("/hooks/t/", BODY, content_type="application/json")
                answers[name] = edge_receiver(request, token="trg_secret")
            finally:
                if name == "A":
                    a_done.set()
                connection.close()

        b = threading.Thread(target=deliver_at, args=("B", EDGE + 0.2), name="B")
        b.start()
        time.sleep(0.3)  # B is looking at the neighbouring buckets
        a = threading.Thread(target=deliver_at, args=("A", EDGE - 0.2), name="A")
        a.start()
        a.join(20)
        b.join(20)
        store.clear()
    assert len(EDGE_RUNS) == 1, (EDGE_RUNS, {n: r.status_code for n, r in answers.items()})
