"""The key contract on the middleware path (plain Django views)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from idempotency_django.models import IdempotencyRecord
from idempotency_django.testing import assert_idempotent
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

URL = "/plain/bookings/"
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})


def post(  # type: ignore[no-untyped-def]
    client: Client, url: str = URL, body: str = BODY, key: str | None = "booking-1", **headers: Any
):
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(url, body, content_type="application/json", **headers)


def test_first_request_runs_and_is_stored(alice_client: Client) -> None:
    response = post(alice_client)
    assert response.status_code == 201
    assert "Idempotency-Replayed" not in response
    assert Booking.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.COMPLETED
    assert record.status_code == 201
    assert record.key == "booking-1"


def test_same_key_same_request_replays_byte_identical(alice_client: Client) -> None:
    first = post(alice_client)
    second = post(alice_client)
    assert second.status_code == 201
    assert second["Idempotency-Replayed"] == "true"
    assert second.content == first.content
    assert second["Content-Type"] == first["Content-Type"]
    assert second["Location"] == first["Location"]
    assert Booking.objects.count() == 1


def test_replay_never_carries_cookies_or_unlisted_headers(alice_client: Client) -> None:
    first = post(alice_client)
    assert "session_hint" in first.cookies
    second = post(alice_client)
    assert "session_hint" not in second.cookies
    assert "X-Debug-Only" not in second
    record = IdempotencyRecord.objects.get()
    names = {name.lower() for name, _ in record.response_headers}
    assert "set-cookie" not in names and "x-debug-only" not in names


def test_same_key_different_body_is_reused_conflict(alice_client: Client) -> None:
    post(alice_client)
    response = post(alice_client, body=json.dumps({"slot": "2026-07-31T09:00:00Z"}))
    assert response.status_code == 409
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_key_reused"
    assert response.json()["status"] == 409
    assert Booking.objects.count() == 1


def test_same_key_different_path_or_query_is_reused(alice_client: Client) -> None:
    post(alice_client)
    assert post(alice_client, url=URL + "?status=200").json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


@override_settings(IDEMPOTENCY={"REUSE_STATUS": 422})
def test_reuse_status_is_configurable(alice_client: Client) -> None:
    post(alice_client)
    response = post(alice_client, body="{}")
    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"


def test_in_progress_reservation_gets_409_with_retry_after(
    alice: User, alice_client: Client
) -> None:
    IdempotencyRecord.objects.create(
        principal=f"auth.user:{alice.pk}",
        location="",
        key="booking-1",
        fingerprint=_fingerprint_of(alice_client),
        method="POST",
        path=URL,
        state=IdempotencyRecord.State.IN_PROGRESS,
        token="someone-else",
        expires_at=_in(300),
    )
    response = post(alice_client)
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_key_in_progress"
    assert response["Retry-After"] == "1"
    assert Booking.objects.count() == 0


def test_abandoned_reservation_is_taken_over_after_lock_timeout(
    alice: User, alice_client: Client
) -> None:
    IdempotencyRecord.objects.create(
        principal=f"auth.user:{alice.pk}",
        key="booking-1",
        fingerprint="whatever",
        method="POST",
        path=URL,
        state=IdempotencyRecord.State.IN_PROGRESS,
        token="crashed-worker",
        expires_at=_in(-1),
    )
    response = post(alice_client)
    assert response.status_code == 201
    assert Booking.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyRecord.State.COMPLETED


def test_expired_completed_record_counts_as_absent(alice_client: Client) -> None:
    post(alice_client)
    IdempotencyRecord.objects.update(expires_at=_in(-1))
    response = post(alice_client)
    assert "Idempotency-Replayed" not in response
    assert Booking.objects.count() == 2


@pytest.mark.parametrize("method", ["get", "head", "options"])
def test_safe_methods_pass_through_untouched(alice_client: Client, method: str) -> None:
    response = getattr(alice_client, method)(URL, HTTP_IDEMPOTENCY_KEY="same")
    getattr(alice_client, method)(URL, HTTP_IDEMPOTENCY_KEY="same")
    assert "Idempotency-Replayed" not in response
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_all_unsafe_methods_are_protected(alice_client: Client, method: str) -> None:
    assert_idempotent(alice_client, method, URL, json.loads(BODY))
    assert Booking.objects.count() == 1


def test_without_key_nothing_is_stored(alice_client: Client) -> None:
    post(alice_client, key=None)
    post(alice_client, key=None)
    assert Booking.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0


def test_5xx_is_released_so_the_retry_runs(alice_client: Client) -> None:
    assert post(alice_client, url=URL + "?status=500").status_code == 500
    assert IdempotencyRecord.objects.count() == 0
    retry = post(alice_client, url=URL + "?status=500")
    assert "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 2


def test_exception_releases_the_key(alice_client: Client) -> None:
    alice_client.raise_request_exception = False
    assert post(alice_client, url=URL + "?raise=1").status_code == 500
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 422, 429])
def test_4xx_not_retained_by_default(alice_client: Client, status: int) -> None:
    post(alice_client, url=f"{URL}?status={status}")
    assert IdempotencyRecord.objects.count() == 0
    assert "Idempotency-Replayed" not in post(alice_client, url=f"{URL}?status={status}")


@override_settings(
    IDEMPOTENCY={"RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"}
)
@pytest.mark.parametrize(
    ("status", "retained"),
    [
        (400, True),
        (404, True),
        (422, True),
        (401, False),
        (403, False),
        (408, False),
        (409, False),
        (429, False),
    ],
)
def test_retain_client_errors_setting(alice_client: Client, status: int, retained: bool) -> None:
    post(alice_client, url=f"{URL}?status={status}")
    replay = post(alice_client, url=f"{URL}?status={status}")
    assert (replay.get("Idempotency-Replayed") == "true") is retained
    assert Booking.objects.count() == (1 if retained else 2)


def test_per_view_retain_client_errors(alice_client: Client) -> None:
    post(alice_client, url="/plain/client-error/")
    assert post(alice_client, url="/plain/client-error/")["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


def test_streaming_response_is_never_stored(alice_client: Client) -> None:
    response = post(alice_client, url=URL + "?stream=1")
    assert b"".join(response.streaming_content).startswith(b"streamed")
    assert IdempotencyRecord.objects.count() == 0


def test_location_scopes_keys(alice_client: Client) -> None:
    post(alice_client, HTTP_X_LOCATION_ID="portland")
    other = post(alice_client, HTTP_X_LOCATION_ID="seattle")
    assert "Idempotency-Replayed" not in other
    assert post(alice_client, HTTP_X_LOCATION_ID="portland")["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 2


def test_users_never_see_each_other(alice_client: Client, bob_client: Client) -> None:
    first = post(alice_client)
    other = post(bob_client)
    assert "Idempotency-Replayed" not in other
    assert other.content != first.content
    assert Booking.objects.count() == 2


def test_anonymous_keyed_request_runs_unprotected_by_default(client: Client) -> None:
    post(client)
    second = post(client)
    assert "Idempotency-Replayed" not in second
    assert IdempotencyRecord.objects.count() == 0


@override_settings(IDEMPOTENCY={"ANONYMOUS": "reject"})
def test_anonymous_can_be_rejected(client: Client) -> None:
    response = post(client)
    assert response.status_code == 401
    assert response.json()["code"] == "idempotency_authentication_required"
    assert Booking.objects.count() == 0


@pytest.mark.parametrize(
    "key",
    ["", " ", "x" * 256, "bad\x01key", "caf\u00e9", "a, b", '"a", "b"', '"unterminated\\"'],
)
def test_invalid_keys_are_400_and_nothing_runs(alice_client: Client, key: str) -> None:
    response = post(alice_client, key=key)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_key_invalid"
    assert Booking.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_structured_field_string_form_is_the_same_key(alice_client: Client) -> None:
    post(alice_client, key="booking-1")
    assert post(alice_client, key='"booking-1"')["Idempotency-Replayed"] == "true"


def test_longest_valid_key(alice_client: Client) -> None:
    assert post(alice_client, key="k" * 255).status_code == 201


def test_required_view_without_key(alice_client: Client) -> None:
    response = post(alice_client, url="/plain/required/", key=None)
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_key_missing"
    assert Booking.objects.count() == 0


def test_per_view_retention(alice_client: Client) -> None:
    from django.utils import timezone

    post(alice_client, url="/plain/required/")
    record = IdempotencyRecord.objects.get()
    remaining = (record.expires_at - timezone.now()).total_seconds()
    assert 50 < remaining <= 60


@override_settings(IDEMPOTENCY={"RETENTION": 7200})
def test_global_retention(alice_client: Client) -> None:
    from django.utils import timezone

    post(alice_client)
    remaining = (IdempotencyRecord.objects.get().expires_at - timezone.now()).total_seconds()
    assert 7100 < remaining <= 7200


def test_exempt_view_is_not_protected(alice_client: Client) -> None:
    post(alice_client, url="/plain/exempt/")
    post(alice_client, url="/plain/exempt/")
    assert Booking.objects.count() == 2


def test_decorated_class_based_view(alice_client: Client) -> None:
    assert_idempotent(alice_client, "POST", "/plain/cbv/", json.loads(BODY))
    assert Booking.objects.count() == 1


def test_decorated_view_is_processed_once_with_middleware(alice_client: Client) -> None:
    post(alice_client, url="/plain/required/")
    assert IdempotencyRecord.objects.count() == 1
    assert post(alice_client, url="/plain/required/")["Idempotency-Replayed"] == "true"


@override_settings(IDEMPOTENCY={"LOCATION_HEADER": "X-Tenant"})
def test_location_header_is_configurable(alice_client: Client) -> None:
    post(alice_client, HTTP_X_TENANT="a")
    assert "Idempotency-Replayed" not in post(alice_client, HTTP_X_TENANT="b")


def test_oversized_location_is_400(alice_client: Client) -> None:
    response = post(alice_client, HTTP_X_LOCATION_ID="l" * 256)
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_location_invalid"
    assert Booking.objects.count() == 0


def _fingerprint_of(client: Client) -> str:
    from django.test import RequestFactory

    from idempotency_django.protocol.fingerprint import default_fingerprint

    request = RequestFactory().post(URL, BODY, content_type="application/json")
    return default_fingerprint(request)


def _in(seconds: int):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(seconds=seconds)


def test_replay_claims_in_one_statement_that_cannot_fail(alice_client: Client) -> None:
    """No failed INSERT per replay: no "duplicate key" error (naming the key) in the server log."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    post(alice_client)
    with CaptureQueriesContext(connection) as queries:
        assert post(alice_client)["Idempotency-Replayed"] == "true"
    store_sql = [q["sql"] for q in queries if "idempotency_django_idempotencyrecord" in q["sql"]]
    if connection.vendor == "sqlite":
        # Outside a transaction SQLite reads first: a replay writes nothing.
        assert len(store_sql) == 1 and store_sql[0].startswith("SELECT"), store_sql
        return
    assert len(store_sql) == 2, store_sql  # the claim, and the read of the stored response
    if connection.vendor == "mysql":
        assert store_sql[0].startswith("INSERT IGNORE INTO")
    else:
        assert store_sql[0].startswith("INSERT INTO")
        assert "ON CONFLICT" in store_sql[0] and "DO NOTHING" in store_sql[0]
    assert store_sql[1].startswith("SELECT")


def test_the_statements_of_a_claim_in_a_transaction(alice_client: Client) -> None:
    """Inside the view's transaction (``atomic=True``) PostgreSQL's claim takes the key's
    advisory lock in its INSERT: a first request sends its claim and its completion, no
    statement of its own for the lock, and a replay's live record answers for itself
    (its claim, then its read). MariaDB/MySQL read the key first (NOWAIT); SQLite has no
    lock to take."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    table = "idempotency_django_idempotencyrecord"
    with CaptureQueriesContext(connection) as first:
        assert post(alice_client, url="/plain/atomic/").status_code == 201
    with CaptureQueriesContext(connection) as replay:
        assert post(alice_client, url="/plain/atomic/")["Idempotency-Replayed"] == "true"
    first_sql = [q["sql"] for q in first if table in q["sql"] or "advisory" in q["sql"]]
    replay_sql = [q["sql"] for q in replay if table in q["sql"] or "advisory" in q["sql"]]
    kinds = {
        "postgresql": (["INSERT", "UPDATE"], ["INSERT", "SELECT"]),
        "mysql": (["SELECT", "INSERT", "UPDATE"], ["SELECT"]),
        "sqlite": (["INSERT", "UPDATE"], ["INSERT", "SELECT"]),
    }[connection.vendor]
    assert [sql.split()[0] for sql in first_sql] == kinds[0], first_sql
    assert [sql.split()[0] for sql in replay_sql] == kinds[1], replay_sql
    if connection.vendor == "postgresql":
        for claim in (first_sql[0], replay_sql[0]):
            assert "WHERE pg_try_advisory_xact_lock(" in claim and "ON CONFLICT" in claim, claim


@pytest.mark.parametrize("url", ["/plain/bookings/", "/plain/cbv/", "/api/bookings/"])
def test_the_protection_can_be_switched_off(alice_client: Client, url: str) -> None:
    with override_settings(IDEMPOTENCY={"ENABLED": False, "REQUIRED": True}):
        assert post(alice_client, url=url).status_code == 201
        again = post(alice_client, url=url)
    assert again.status_code == 201 and "Idempotency-Replayed" not in again
    assert Booking.objects.count() == 2
    assert not IdempotencyRecord.objects.exists()
