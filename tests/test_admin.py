from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from idempotency_django.admin import (
    BODY_DISPLAY_LIMIT,
    EstimatedCountPaginator,
    expiry_state,
    render_body,
    render_headers,
)
from idempotency_django.models import IdempotencyRecord
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:idempotency_django_idempotencyrecord_changelist"


def change_url(record: IdempotencyRecord) -> str:
    return reverse("admin:idempotency_django_idempotencyrecord_change", args=[record.pk])


def delete_url(record: IdempotencyRecord) -> str:
    return reverse("admin:idempotency_django_idempotencyrecord_delete", args=[record.pk])


@pytest.fixture
def admin_user(db: None) -> User:
    return User.objects.create_superuser("root", "root@example.com", "root-password")


@pytest.fixture
def admin_client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def viewer_client(db: None) -> Client:
    viewer = User.objects.create_user("viewer", password="viewer-password", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_idempotencyrecord"))
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def records() -> dict[str, IdempotencyRecord]:
    now = timezone.now()
    return {
        "completed": IdempotencyRecordFactory(
            key="key-completed", principal="user:1", path="/orders/", status_code=201
        ),
        "redirect": IdempotencyRecordFactory(
            key="key-redirect", principal="user:2", status_code=303, method="PUT"
        ),
        "client-error": IdempotencyRecordFactory(
            key="key-client-error", principal="user:2", status_code=422, location="shop-7"
        ),
        "server-error": IdempotencyRecordFactory(
            key="key-server-error", principal="svc:a", status_code=500
        ),
        "expired": IdempotencyRecordFactory(key="key-expired", principal="svc:b", expired=True),
        "reserved": IdempotencyRecordFactory(
            key="key-reserved", principal="svc:c", in_progress=True, method="PATCH"
        ),
        "abandoned": IdempotencyRecordFactory(
            key="key-abandoned",
            principal="svc:d",
            in_progress=True,
            created_at=now - timedelta(days=3),
            expires_at=now - timedelta(days=3) + timedelta(seconds=300),
        ),
    }


def listed(response: object) -> set[str]:
    return {record.key for record in response.context["cl"].result_list}  # type: ignore[attr-defined]


# -- changelist ----------------------------------------------------------------


def test_changelist_columns(admin_client: Client, records: dict[str, IdempotencyRecord]) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert listed(response) == {record.key for record in records.values()}
    content = response.content.decode()
    for heading in [
        "Idempotency key",
        "Principal",
        "Location",
        "Method",
        "Path",
        "State",
        "Response status",
        "Created",
        "Expires",
    ]:
        assert f">{heading}<" in content, heading
    assert "in progress" in content and "completed" in content and "expired" in content
    assert records["completed"].token not in content
    # Newest first.
    keys = [record.key for record in response.context["cl"].result_list]
    assert keys[-1] == "key-abandoned"


def test_changelist_does_not_load_bodies(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    table = IdempotencyRecord._meta.db_table
    table_sql = f"FROM {connection.ops.quote_name(table)}"
    selects = [q["sql"] for q in queries.captured_queries if table_sql in q["sql"]]
    assert selects
    assert all("response_body" not in sql and "response_headers" not in sql for sql in selects)
    # show_full_result_count = False: no second, unfiltered count.
    counts = [sql for sql in selects if "COUNT(" in sql.upper()]
    assert len(counts) <= 1


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"state": "in_progress"}, {"key-reserved"}),
        (
            {"state": "completed"},
            {"key-completed", "key-redirect", "key-client-error", "key-server-error"},
        ),
        ({"state": "expired"}, {"key-expired", "key-abandoned"}),
        (
            {"status_class": "2xx"},
            {"key-completed", "key-expired"},
        ),
        ({"status_class": "3xx"}, {"key-redirect"}),
        ({"status_class": "4xx"}, {"key-client-error"}),
        ({"status_class": "5xx"}, {"key-server-error"}),
        ({"status_class": "none"}, {"key-reserved", "key-abandoned"}),
        ({"method": "PUT"}, {"key-redirect"}),
        ({"method": "PATCH"}, {"key-reserved"}),
        ({"location": "shop-7"}, {"key-client-error"}),
        ({"location": "nowhere"}, set()),
        ({"q": "key-redir"}, {"key-redirect"}),
        ({"q": "/orders/"}, {"key-completed"}),
        ({"q": "user:2"}, {"key-redirect", "key-client-error"}),
        ({"q": "user:2", "status_class": "4xx"}, {"key-client-error"}),
    ],
)
def test_changelist_filters_and_search(
    admin_client: Client,
    records: dict[str, IdempotencyRecord],
    query: dict[str, str],
    expected: set[str],
) -> None:
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert listed(response) == expected


def test_changelist_date_filters(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    now = timezone.localtime()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    response = admin_client.get(
        reverse(CHANGELIST),
        {
            "created_at__gte": today.isoformat(sep=" "),
            "created_at__lt": (today + timedelta(days=1)).isoformat(sep=" "),
        },
    )
    assert response.status_code == 200
    assert "key-abandoned" not in listed(response) and "key-expired" not in listed(response)
    assert "key-completed" in listed(response)
    response = admin_client.get(
        reverse(CHANGELIST), {"created_at__year": now.year, "created_at__month": now.month}
    )
    assert response.status_code == 200
    assert "key-completed" in listed(response)


def test_location_choices_come_from_recent_rows(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    from idempotency_django.admin import LocationFilter

    response = admin_client.get(reverse(CHANGELIST))
    choices = [
        c["display"]
        for spec in response.context["cl"].filter_specs
        if isinstance(spec, LocationFilter)
        for c in spec.choices(response.context["cl"])
    ]
    assert choices == ["All", "shop-7"]
    IdempotencyRecordFactory(location="shop-new")
    response = admin_client.get(reverse(CHANGELIST), {"location": "bookmarked"})
    content = response.content.decode()
    assert "?location=shop-new" in content and "?location=bookmarked" in content


def test_filter_sidebar_lists_choices(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    content = admin_client.get(reverse(CHANGELIST)).content.decode()
    for label in ["By state", "By status class", "By method", "By location", "By created"]:
        assert label in content, label
    assert "4xx client error" in content
    assert "?state=expired" in content


# -- detail --------------------------------------------------------------------


def test_detail_shows_everything_read_only_but_the_token(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(
        key="key-detail",
        request_id="req-abc-123",
        fingerprint="f" * 64,
        response_headers=[["Content-Type", "application/json"], ["Location", "/orders/9/"]],
        response_body=b'{"id":9,"items":[1,2]}',
    )
    response = admin_client.get(change_url(record))
    assert response.status_code == 200
    content = response.content.decode()
    assert "key-detail" in content and "req-abc-123" in content and "f" * 64 in content
    assert "{\n  &quot;id&quot;: 9,\n  &quot;items&quot;: [\n    1," in content
    assert "<th scope='row'>Location</th><td>/orders/9/</td>" in content
    assert "<th scope='row'>Content-Type</th><td>application/json</td>" in content
    assert record.token not in content
    assert "owner token" not in content.lower()
    # View-only: no form inputs to save, no save buttons.
    assert 'name="_save"' not in content
    assert '<input type="text"' not in content
    assert "Delete" in content  # the superuser may evict the key


def test_detail_escapes_html_bodies_and_headers(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(
        response_headers=[["X-Evil", "<b>bold</b>"]],
        response_body=b"<script>alert('x')</script> & more",
    )
    content = admin_client.get(change_url(record)).content.decode()
    assert "<script>alert" not in content
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in content
    assert "&lt;b&gt;bold&lt;/b&gt;" in content


def test_detail_binary_body(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(response_body=b"\xff\xfe\x00\x01binary")
    content = admin_client.get(change_url(record)).content.decode()
    assert "10 bytes, binary (not UTF-8)" in content
    assert "ff fe 00 01" in content


def test_detail_of_a_reservation(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(in_progress=True)
    content = admin_client.get(change_url(record)).content.decode()
    assert "in progress" in content
    assert "(empty)" in content and "(none)" in content


def test_no_add_and_no_edit(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(key="unchanged")
    assert (
        admin_client.get(reverse("admin:idempotency_django_idempotencyrecord_add")).status_code
        == 403
    )
    response = admin_client.post(change_url(record), {"key": "changed"})
    assert response.status_code == 403
    record.refresh_from_db()
    assert record.key == "unchanged"


# -- actions -------------------------------------------------------------------


def test_release_asks_for_confirmation_then_releases(
    admin_client: Client, admin_user: User, records: dict[str, IdempotencyRecord]
) -> None:
    selected = [records["reserved"].pk, records["abandoned"].pk, records["completed"].pk]
    data = {"action": "release_reservations", "_selected_action": selected}
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 200
    assert "admin/idempotency_django/release_confirmation.html" in [
        t.name for t in response.templates
    ]
    content = response.content.decode()
    assert "Release these 2 reservations?" in content
    assert "1 of them is still within its takeover window" in content
    assert "1 selected record is not a reservation in progress" in content
    assert IdempotencyRecord.objects.filter(pk__in=selected).count() == 3

    response = admin_client.post(reverse(CHANGELIST), {**data, "post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Released 2 reservations." in response.content.decode()
    assert set(IdempotencyRecord.objects.filter(pk__in=selected).values_list("key", flat=True)) == {
        "key-completed"
    }
    entries = LogEntry.objects.filter(action_flag=DELETION).order_by("object_id")
    assert {(e.object_id, e.user_id) for e in entries} == {
        (str(records["reserved"].pk), admin_user.pk),
        (str(records["abandoned"].pk), admin_user.pk),
    }
    assert all(e.change_message == "Released stuck reservation." for e in entries)


def test_release_keeps_a_record_completed_after_confirmation(admin_client: Client) -> None:
    record = IdempotencyRecordFactory(in_progress=True)
    data = {"action": "release_reservations", "_selected_action": [record.pk]}
    assert admin_client.post(reverse(CHANGELIST), data).status_code == 200
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        state=IdempotencyRecord.State.COMPLETED, status_code=201
    )
    response = admin_client.post(reverse(CHANGELIST), {**data, "post": "yes"}, follow=True)
    assert "None of the selected records is a reservation." in response.content.decode()
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert not LogEntry.objects.exists()


def test_release_with_no_reservation_selected(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    data = {"action": "release_reservations", "_selected_action": [records["completed"].pk]}
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert response.status_code == 200
    assert "nothing released" in response.content.decode()
    assert IdempotencyRecord.objects.count() == len(records)


def test_delete_selected_evicts_keys(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    selected = [records["completed"].pk, records["expired"].pk]
    data = {"action": "delete_selected", "_selected_action": selected}
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 200
    assert "Are you sure" in response.content.decode()
    response = admin_client.post(reverse(CHANGELIST), {**data, "post": "yes"})
    assert response.status_code == 302
    assert not IdempotencyRecord.objects.filter(pk__in=selected).exists()
    assert IdempotencyRecord.objects.count() == len(records) - 2
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 2


def test_delete_one_from_its_page(admin_client: Client) -> None:
    record = IdempotencyRecordFactory()
    assert admin_client.get(delete_url(record)).status_code == 200
    response = admin_client.post(delete_url(record), {"post": "yes"})
    assert response.status_code == 302
    assert not IdempotencyRecord.objects.exists()
    assert LogEntry.objects.get().action_flag == DELETION


# -- permissions ---------------------------------------------------------------


def test_view_only_staff_sees_but_cannot_evict_or_release(
    viewer_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    response = viewer_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert len(listed(response)) == len(records)
    assert response.context["action_form"] is None
    assert "release_reservations" not in response.content.decode()

    detail = viewer_client.get(change_url(records["completed"]))
    assert detail.status_code == 200
    assert "key-completed" in detail.content.decode()
    assert delete_url(records["completed"]) not in detail.content.decode()

    assert viewer_client.get(delete_url(records["completed"])).status_code == 403
    assert viewer_client.post(delete_url(records["completed"]), {"post": "yes"}).status_code == 403
    for action in ["release_reservations", "delete_selected"]:
        viewer_client.post(
            reverse(CHANGELIST),
            {
                "action": action,
                "_selected_action": [r.pk for r in records.values()],
                "post": "yes",
            },
        )
    assert IdempotencyRecord.objects.count() == len(records)
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("who", ["anonymous", "non-staff"])
def test_others_are_sent_to_the_login_page(
    who: str, alice_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    client = Client() if who == "anonymous" else alice_client
    for url in [reverse(CHANGELIST), change_url(records["completed"])]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


# -- pieces --------------------------------------------------------------------


def test_expiry_state() -> None:
    now = timezone.now()
    assert expiry_state("in_progress", now + timedelta(seconds=1), now) == "in_progress"
    assert expiry_state("completed", now + timedelta(seconds=1), now) == "completed"
    assert expiry_state("completed", now, now) == "expired"
    assert expiry_state("in_progress", now - timedelta(seconds=1), now) == "expired"


def test_render_body_cuts_huge_bodies() -> None:
    html = render_body(b"x" * (BODY_DISPLAY_LIMIT + 10))
    assert f"showing {BODY_DISPLAY_LIMIT} of {BODY_DISPLAY_LIMIT + 10} characters" in html
    assert render_body(memoryview(b'"text"')).count("&quot;text&quot;") == 1
    assert "(empty)" in render_body(b"")
    assert "(none)" in render_headers("not a list of pairs")


def test_estimated_count_paginator_counts_exactly_when_it_should() -> None:
    IdempotencyRecordFactory.create_batch(3)
    queryset = IdempotencyRecord.objects.order_by("pk")
    paginator = EstimatedCountPaginator(queryset, 2)
    assert paginator.count == 3
    assert EstimatedCountPaginator(queryset.filter(method="PUT"), 2).count == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL planner estimate")
def test_estimated_count_paginator_uses_the_estimate_on_postgres() -> None:
    IdempotencyRecordFactory.create_batch(5)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {IdempotencyRecord._meta.db_table}")
    queryset = IdempotencyRecord.objects.order_by("pk")

    class Estimating(EstimatedCountPaginator):
        exact_below = 0

    assert Estimating(queryset, 2)._estimate() is not None
    assert Estimating(queryset.filter(method="PUT"), 2)._estimate() is None
    assert Estimating(queryset.filter(method="PUT"), 2).count == 0


DELIVERIES = "/admin/idempotency_django/webhookdelivery/"


@pytest.fixture
def deliveries() -> dict[str, IdempotencyRecord]:
    return {
        "accepted": IdempotencyRecordFactory(
            kind="webhook",
            key="msg_2Lh9",
            source="standard-webhooks",
            principal="webhook:" + "ab" * 32,
            method="POST",
            path="hooks/<str:token>/",
            response_body=b'{"run_id": "run-77"}',
        ),
        "running": IdempotencyRecordFactory(
            kind="webhook", key="evt_running", source="body", in_progress=True
        ),
    }


def test_deliveries_have_their_own_read_only_page(
    admin_client: Client,
    deliveries: dict[str, IdempotencyRecord],
    records: dict[str, IdempotencyRecord],
) -> None:
    listing = admin_client.get(DELIVERIES)
    assert listing.status_code == 200
    html = listing.content.decode()
    for text in ("msg_2Lh9", "standard-webhooks", "ab" * 32, "run-77", "evt_running"):
        assert text in html
    # Requests are not listed among deliveries, nor deliveries among requests.
    assert all(record.key not in html for record in records.values())
    records_html = admin_client.get("/admin/idempotency_django/idempotencyrecord/").content.decode()
    assert "msg_2Lh9" not in records_html
    detail = admin_client.get(f"{DELIVERIES}{deliveries['accepted'].pk}/change/")
    assert detail.status_code == 200
    assert "run-77" in detail.content.decode()
    assert 'name="_save"' not in detail.content.decode()
    assert deliveries["accepted"].token not in detail.content.decode()


def test_delivery_filters_and_search(
    admin_client: Client, deliveries: dict[str, IdempotencyRecord]
) -> None:
    by_source = admin_client.get(DELIVERIES + "?source=body").content.decode()
    assert "evt_running" in by_source and "msg_2Lh9" not in by_source
    searched = admin_client.get(DELIVERIES + "?q=msg_2L").content.decode()
    assert "msg_2Lh9" in searched and "evt_running" not in searched
