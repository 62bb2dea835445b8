from __future__ import annotations

import hashlib
import html
import json
import re
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.templatetags.admin_list import result_headers
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.text import capfirst

from idempotency_django import admin as record_admin
from idempotency_django.admin.display import (
    BODY_DISPLAY_LIMIT,
    TOKEN_MAX_LENGTH,
    body_digest,
    principal_usernames,
    render_body,
    render_headers,
)
from idempotency_django.admin.filters import EstimatedCountPaginator, LocationFilter, expiry_state
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store
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
        "completed": IdempotencyRecordFactory.create(
            key="key-completed", principal="user:1", path="/orders/", status_code=201
        ),
        "redirect": IdempotencyRecordFactory.create(
            key="key-redirect", principal="user:2", status_code=303, method="PUT"
        ),
        "client-error": IdempotencyRecordFactory.create(
            key="key-client-error", principal="user:2", status_code=422, location="shop-7"
        ),
        "server-error": IdempotencyRecordFactory.create(
            key="key-server-error", principal="svc:a", status_code=500
        ),
        "expired": IdempotencyRecordFactory.create(
            key="key-expired", principal="svc:b", expired=True
        ),
        "reserved": IdempotencyRecordFactory.create(
            key="key-reserved", principal="svc:c", in_progress=True, method="PATCH"
        ),
        "abandoned": IdempotencyRecordFactory.create(
            key="key-abandoned",
            principal="svc:d",
            in_progress=True,
            created_at=now - timedelta(days=3),
            expires_at=now - timedelta(days=3) + timedelta(seconds=300),
        ),
    }


def without_tags(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def headings(response: Any) -> list[str]:
    """The changelist's column headings, as Django's admin renders them."""
    columns = result_headers(response.context["cl"])
    return [
        capfirst(str(h["text"])) for h in columns if "action-checkbox" not in str(h["class_attrib"])
    ]


def listed(response: object) -> set[str]:
    return {record.key for record in response.context["cl"].result_list}  # type: ignore[attr-defined]


# -- changelist ----------------------------------------------------------------


def test_changelist_columns(admin_client: Client, records: dict[str, IdempotencyRecord]) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert listed(response) == {record.key for record in records.values()}
    content = response.content.decode()
    assert headings(response) == ["Key", "Principal", "Request", "State", "Created", "Expires"]
    assert "in progress" in content and "completed" in content and "expired" in content
    # The state column carries the stored status, and the request its method.
    assert 'completed <span class="quiet">422</span>' in content
    assert "PUT /plain/bookings/" in without_tags(content)
    # Each part a token that never breaks inside, a path only after its slashes.
    assert (
        '<span class="idempotency-token">PUT</span> <span class="idempotency-token">/</span><wbr>'
        '<span class="idempotency-token">plain/</span><wbr>'
        '<span class="idempotency-token">bookings/</span>' in content
    )
    # The scope: the principal, and the location under it when there is one.
    assert (
        '<span class="idempotency-token">user:2</span><br>'
        '<span class="quiet">location: <span class="idempotency-token">shop-7</span></span>'
        in content
    )
    # Times are relative, with the full date and time on hover.
    assert ">now</time>" in content and ">3\xa0days ago</time>" in content
    assert ">in 23\xa0hours</time>" in content
    assert records["completed"].token not in content
    # Newest first.
    keys = [record.key for record in response.context["cl"].result_list]
    assert keys[-1] == "key-abandoned"


@pytest.mark.parametrize("model", ["idempotencyrecord", "webhookdelivery"])
def test_changelist_says_when_another_store_is_active(
    admin_client: Client, records: dict[str, IdempotencyRecord], model: str
) -> None:
    """With the Redis store the database's rows are old ones: the page says which store
    is live, and says nothing with the database store."""
    url = reverse(f"admin:idempotency_django_{model}_changelist")
    assert "idempotency-store-notice" not in admin_client.get(url).content.decode()
    with override_settings(IDEMPOTENCY={"STORE": "redis"}):
        page = admin_client.get(url)
    assert page.status_code == 200
    text = html.unescape(without_tags(page.content.decode()))
    assert 'The active store is Redis (IDEMPOTENCY["STORE"] = "redis")' in text
    assert "these database records are not the live ones" in text


#: The Redis store on a cache alias of its own, as docs/stores.md sets it up: not a
#: database's alias (nothing here reaches the Redis server).
REDIS_ON_ITS_OWN_CACHE = {
    "IDEMPOTENCY": {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}},
    "CACHES": {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/15",
        },
    },
}


def test_the_database_records_stay_manageable_under_the_redis_store(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    """Its records in the database (webhooks', tasks', those of before) are on the
    database the router names: the delete page, the release action and the erasure of a
    principal work there, never on a "database" named after the store's cache."""
    from idempotency_django.purge import purge_principal

    abandoned = records["abandoned"]
    action = {"action": "release_reservations", "_selected_action": [abandoned.pk], "post": "yes"}
    with override_settings(**REDIS_ON_ITS_OWN_CACHE):
        assert admin_client.get(delete_url(records["reserved"])).status_code == 200
        assert admin_client.post(reverse(CHANGELIST), action).status_code == 302
        erased = purge_principal(records["completed"].principal)
    assert not IdempotencyRecord.objects.filter(pk=abandoned.pk).exists()
    assert erased >= 1
    assert not IdempotencyRecord.objects.filter(principal=records["completed"].principal).exists()


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


@pytest.mark.parametrize("query", [{"state": "bogus"}, {"status_class": "6xx"}])
def test_an_unknown_filter_value_filters_nothing_out(
    admin_client: Client, records: dict[str, IdempotencyRecord], query: dict[str, str]
) -> None:
    everything = listed(admin_client.get(reverse(CHANGELIST)))
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert everything and listed(response) == everything


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
    response = admin_client.get(reverse(CHANGELIST))
    choices = [
        c["display"]
        for spec in response.context["cl"].filter_specs
        if isinstance(spec, LocationFilter)
        for c in spec.choices(response.context["cl"])
    ]
    assert choices == ["All", "shop-7"]
    IdempotencyRecordFactory.create(location="shop-new")
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
    record = IdempotencyRecordFactory.create(
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
    record = IdempotencyRecordFactory.create(
        response_headers=[["X-Evil", "<b>bold</b>"]],
        response_body=b"<script>alert('x')</script> & more",
    )
    content = admin_client.get(change_url(record)).content.decode()
    assert "<script>alert" not in content
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in content
    assert "&lt;b&gt;bold&lt;/b&gt;" in content


def test_detail_binary_body(admin_client: Client) -> None:
    record = IdempotencyRecordFactory.create(response_body=b"\xff\xfe\x00\x01binary")
    content = admin_client.get(change_url(record)).content.decode()
    assert "10 bytes, binary (not UTF-8)" in content
    assert "ff fe 00 01" in content


def test_detail_of_a_reservation(admin_client: Client) -> None:
    record = IdempotencyRecordFactory.create(in_progress=True)
    content = admin_client.get(change_url(record)).content.decode()
    assert "in progress" in content
    assert "(empty)" in content and "(none)" in content


def test_no_add_and_no_edit(admin_client: Client) -> None:
    record = IdempotencyRecordFactory.create(key="unchanged")
    assert (
        admin_client.get(reverse("admin:idempotency_django_idempotencyrecord_add")).status_code
        == 403
    )
    response = admin_client.post(change_url(record), {"key": "changed"})
    assert response.status_code == 403
    record.refresh_from_db()
    assert record.key == "unchanged"


# -- actions -------------------------------------------------------------------

DJANGO_CONFIRMATION = "admin/delete_selected_confirmation.html"


def confirmed(client: Client, page: Any, **extra: str) -> Any:
    """POST the confirmation ``page``'s form as a browser would: its hidden fields only."""
    content = page.content.decode()
    form = content[content.index('<form method="post">') :]
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        fields.setdefault(name, []).append(value)
    return client.post(page.wsgi_request.get_full_path(), {**fields, **extra}, follow=True)


def test_release_is_confirmed_on_djangos_delete_page_then_releases(
    admin_client: Client, admin_user: User, records: dict[str, IdempotencyRecord]
) -> None:
    selected = [records["reserved"].pk, records["abandoned"].pk, records["completed"].pk]
    data = {"action": "release_reservations", "_selected_action": selected}
    page = admin_client.post(reverse(CHANGELIST), data)
    assert page.status_code == 200
    assert DJANGO_CONFIRMATION in [t.name for t in page.templates]
    content = page.content.decode()
    assert "<h1>Release stuck reservations?</h1>" in content
    assert "1 of them is a reservation still within its takeover window" in content
    assert "1 selected record is not a reservation in progress" in content
    # What goes: the two reservations, not the completed record.
    assert "key-reserved (svc:c, -)" in content and "key-abandoned (svc:d, -)" in content
    assert "key-completed" not in content
    assert '<input type="hidden" name="action" value="release_reservations">' in content
    assert 'value="delete_selected"' not in content
    assert IdempotencyRecord.objects.filter(pk__in=selected).count() == 3

    response = confirmed(admin_client, page)
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


def test_release_warns_of_a_live_reservation_by_the_databases_clock(admin_client: Client) -> None:
    """An app server whose clock runs ten minutes ahead of the database's still warns
    that the request may be running: the store's takeovers go by the database's clock."""
    key = RecordKey("svc:slow", "", "still-running")
    request = RequestInfo(method="POST", path="/slow/", fingerprint="f" * 64)
    assert get_store().claim(key, request, 300).outcome is Outcome.CLAIMED
    record = IdempotencyRecord.objects.get(digest=key.digest)
    data = {"action": "release_reservations", "_selected_action": [record.pk]}
    with time_machine.travel(timezone.now() + timedelta(minutes=10)):
        content = admin_client.post(reverse(CHANGELIST), data).content.decode()
    assert "1 of them is a reservation still within its takeover window" in content
    with time_machine.travel(timezone.now() - timedelta(minutes=10)):
        IdempotencyRecord.objects.filter(pk=record.pk).update(expires_at=timezone.now())
        content = admin_client.post(reverse(CHANGELIST), data).content.decode()
    assert "Release stuck reservations?" in content and "takeover window" not in content


def test_release_keeps_a_record_completed_after_confirmation(admin_client: Client) -> None:
    record = IdempotencyRecordFactory.create(in_progress=True)
    data = {"action": "release_reservations", "_selected_action": [record.pk]}
    page = admin_client.post(reverse(CHANGELIST), data)
    assert page.status_code == 200
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        state=IdempotencyRecord.State.COMPLETED, status_code=201
    )
    response = confirmed(admin_client, page)
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
    page = admin_client.post(reverse(CHANGELIST), data)
    assert page.status_code == 200
    assert "Are you sure" in page.content.decode()
    response = confirmed(admin_client, page)
    assert "Successfully deleted 2 idempotency records." in response.content.decode()
    assert not IdempotencyRecord.objects.filter(pk__in=selected).exists()
    assert IdempotencyRecord.objects.count() == len(records) - 2
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 2


def test_a_reservation_is_released_from_its_page_by_djangos_delete(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    """A record's Delete is Django's, for a reservation too: its page warns while the
    reservation is within its takeover window, then the key is free."""
    warning = "still within its takeover window"
    live, abandoned = records["reserved"], records["abandoned"]
    assert delete_url(live) in admin_client.get(change_url(live)).content.decode()
    assert warning in admin_client.get(delete_url(live)).content.decode()
    assert warning not in admin_client.get(delete_url(abandoned)).content.decode()
    assert warning not in admin_client.get(delete_url(records["completed"])).content.decode()
    response = admin_client.post(delete_url(live), {"post": "yes"})
    assert response.status_code == 302
    assert not IdempotencyRecord.objects.filter(pk=live.pk).exists()
    assert LogEntry.objects.get().action_flag == DELETION


def test_a_task_reservation_is_listed_and_released(admin_client: Client) -> None:
    """A worker that died mid-task leaves its key reserved: staff can see and release it."""
    key = RecordKey("task:billing.charge", "", "invoice-77")
    task = RequestInfo(method="TASK", path="billing.charge", fingerprint="f" * 64, kind="task")
    assert get_store().claim(key, task, 300).outcome is Outcome.CLAIMED
    record = IdempotencyRecord.objects.get(digest=key.digest)
    assert listed(admin_client.get(reverse(CHANGELIST))) == {"invoice-77"}
    assert "billing.charge" in admin_client.get(change_url(record)).content.decode()
    data = {"action": "release_reservations", "_selected_action": [record.pk]}
    released = confirmed(admin_client, admin_client.post(reverse(CHANGELIST), data))
    assert "Released 1 reservation." in released.content.decode()
    assert not IdempotencyRecord.objects.exists()


def test_evicting_a_live_reservation_warns_as_releasing_does(
    admin_client: Client, records: dict[str, IdempotencyRecord]
) -> None:
    """Deleting a reservation is releasing it: a retry may then run a request still running."""
    live, abandoned = records["reserved"], records["abandoned"]
    selected = [live.pk, abandoned.pk, records["completed"].pk]
    data = {"action": "delete_selected", "_selected_action": selected}
    content = admin_client.post(reverse(CHANGELIST), data).content.decode()
    assert "1 of them is a reservation still within its takeover window" in content
    assert "Are you sure" in content
    data["_selected_action"] = [abandoned.pk, records["completed"].pk]
    content = admin_client.post(reverse(CHANGELIST), data).content.decode()
    assert "Are you sure" in content and "takeover window" not in content


# -- permissions ---------------------------------------------------------------


def logged_in_with_csrf_checks(username: str, password: str) -> tuple[Client, str]:
    """A browser-like client: the login form, CSRF enforced; and its CSRF token."""
    client = Client(enforce_csrf_checks=True)
    login = reverse("admin:login")
    token = re.search(
        r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get(login).content.decode()
    )
    assert token is not None
    form = {"username": username, "password": password, "csrfmiddlewaretoken": token[1]}
    assert client.post(login, {**form, "next": "/admin/"}).status_code == 302
    return client, client.cookies["csrftoken"].value


def test_actions_need_the_csrf_token_and_the_delete_permission_after_a_real_login(
    admin_user: User,
) -> None:
    """No forged POST releases, evicts or erases; a viewer's valid POST does not either;
    the confirmation's own form, token and all, releases."""
    record = IdempotencyRecordFactory.create(key="stuck", in_progress=True)
    root, root_token = logged_in_with_csrf_checks("root", "root-password")
    actions = ["release_reservations", "delete_principal_records", "delete_selected"]
    for action in actions:
        data = {"action": action, "_selected_action": [record.pk], "post": "yes"}
        assert root.post(reverse(CHANGELIST), data).status_code == 403
    assert root.post(delete_url(record), {"post": "yes"}).status_code == 403
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()

    viewer = User.objects.create_user("viewer", password="viewer-password", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_idempotencyrecord"))
    client, token = logged_in_with_csrf_checks("viewer", "viewer-password")
    for action in actions:
        data = {
            "action": action,
            "_selected_action": [record.pk],
            "post": "yes",
            "csrfmiddlewaretoken": token,
        }
        answer = client.post(reverse(CHANGELIST), data)  # none of its actions: nothing done
        assert DJANGO_CONFIRMATION not in [t.name for t in answer.templates]
    form = {"post": "yes", "csrfmiddlewaretoken": token}
    assert client.post(delete_url(record), form).status_code == 403
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()

    data = {
        "action": "release_reservations",
        "_selected_action": [record.pk],
        "csrfmiddlewaretoken": root_token,
    }
    page = root.post(reverse(CHANGELIST), data)
    assert "Released 1 reservation." in confirmed(root, page).content.decode()
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()


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
    for action in ["release_reservations", "delete_selected", "delete_principal_records"]:
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


# -- stored responses ------------------------------------------------------------

SECRET = "sk_live_one_time_4f9a2c7e81d3"


@pytest.fixture
def secret_record() -> IdempotencyRecord:
    return IdempotencyRecordFactory.create(
        key="key-secret",
        response_headers=[["Content-Type", "application/json"], ["Location", f"/keys/{SECRET}/"]],
        response_body=json.dumps({"id": 7, "api_key": SECRET}).encode(),
    )


def staff_client(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="staff-password", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("who", "sees_bodies"),
    [("view only", False), ("view and stored responses", True), ("superuser", True)],
)
def test_stored_bodies_need_their_own_permission(
    who: str, sees_bodies: bool, admin_client: Client, secret_record: IdempotencyRecord
) -> None:
    if who == "superuser":
        client = admin_client
    elif who == "view only":
        client = staff_client("viewer", "view_idempotencyrecord")
    else:
        client = staff_client("reader", "view_idempotencyrecord", "view_stored_response")
    listing = client.get(reverse(CHANGELIST))
    detail = client.get(change_url(secret_record))
    assert listing.status_code == detail.status_code == 200
    listing_html, detail_html = listing.content.decode(), detail.content.decode()
    assert "key-secret" in listing_html and "key-secret" in detail_html
    assert SECRET not in listing_html  # the list never loads a body, for anyone
    assert (SECRET in detail_html) is sees_bodies
    content_type = "<th scope='row'>Content-Type</th><td>application/json</td>"
    assert content_type in detail_html
    if not sees_bodies:
        body = bytes(secret_record.response_body)
        assert f"{len(body)} bytes, application/json, digest" in detail_html
        assert f">{body_digest(body)}</code>" in detail_html
        assert "<th scope='row'>Location</th><td><span class=\"quiet\">(hidden)</span>" in (
            detail_html
        )
        assert "Can view stored response bodies" in detail_html


def test_the_permission_is_created_by_the_migrations() -> None:
    permission = Permission.objects.get(codename="view_stored_response")
    assert permission.name == "Can view stored response bodies"
    assert permission.content_type.model_class() is IdempotencyRecord
    assert record_admin.STORED_RESPONSE_PERMISSION == "idempotency_django.view_stored_response"


@pytest.mark.parametrize(
    "lookup",
    [
        "response_body",
        "response_body__gt",
        "response_headers__icontains",
        "token",
        "token__startswith",
    ],
)
def test_url_lookups_cannot_probe_bodies_or_tokens(
    lookup: str, secret_record: IdempotencyRecord
) -> None:
    """``?response_body__gt=...`` would tell a body one comparison at a time."""
    client = staff_client("viewer", "view_idempotencyrecord")
    response = client.get(reverse(CHANGELIST), {lookup: "sk_live"})
    assert response.status_code == 400
    # Lookups on the listed columns still work from a URL.
    assert listed(client.get(reverse(CHANGELIST), {"key__startswith": "key-s"})) == {"key-secret"}


def test_body_digest_tells_bodies_apart_without_confirming_guesses() -> None:
    assert body_digest(b'{"approved": true}') == body_digest(b'{"approved": true}')
    assert body_digest(b'{"approved": true}') != body_digest(b'{"approved": false}')
    assert len(body_digest(b"x")) == 12
    # Keyed with the SECRET_KEY: a plain hash of a guessed body does not match it.
    assert body_digest(b"x") != hashlib.sha256(b"x").hexdigest()[:12]
    with override_settings(SECRET_KEY="another-secret-key-for-this-test"):
        assert body_digest(b"x") != hashlib.sha256(b"x").hexdigest()[:12]
        other = body_digest(b"x")
    assert other != body_digest(b"x")


# -- principals ------------------------------------------------------------------


def test_principals_are_shown_as_the_users_they_name(admin_client: Client) -> None:
    carol = User.objects.create_user("carol", "carol@example.com")
    record = IdempotencyRecordFactory.create(key="k-carol", principal=f"auth.user:{carol.pk}")
    IdempotencyRecordFactory.create(key="k-gone", principal="auth.user:987654")
    IdempotencyRecordFactory.create(key="k-other-model", principal=f"testapp.booking:{carol.pk}")
    IdempotencyRecordFactory.create(key="k-bad-pk", principal="auth.user:not-a-number")
    IdempotencyRecordFactory.create(key="k-padded", principal=f"auth.user:0{carol.pk}")
    IdempotencyRecordFactory.create(key="k-long", principal="sha256:" + "ab" * 32)
    content = admin_client.get(reverse(CHANGELIST)).content.decode()
    named = (
        '<span class="idempotency-token">carol</span> <span class="quiet">'
        f'<span class="idempotency-token">(auth.user:{carol.pk})</span></span>'
    )
    assert content.count(named) == 1
    for raw in [
        "auth.user:987654",
        f"testapp.booking:{carol.pk}",
        "auth.user:not-a-number",
        f"auth.user:0{carol.pk}",
    ]:
        css = "idempotency-token" if len(raw) <= TOKEN_MAX_LENGTH else "idempotency-long"
        token = f'<span class="{css}">{raw}</span>'
        assert f'<td class="field-scope_display">{token}</td>' in content, raw
    # Too long for one line of its column: it may break.
    long = '<span class="idempotency-long">sha256:' + "ab" * 32 + "</span>"
    assert f'<td class="field-scope_display">{long}</td>' in content
    assert named in admin_client.get(change_url(record)).content.decode()


def test_changelist_names_the_users_of_a_page_in_one_query(admin_client: Client) -> None:
    def queries_for(count: int) -> int:
        IdempotencyRecord.objects.all().delete()
        users = [User.objects.create_user(f"user-{count}-{n}") for n in range(count)]
        for user in users:
            IdempotencyRecordFactory.create(principal=f"auth.user:{user.pk}")
        with CaptureQueriesContext(connection) as queries:
            content = admin_client.get(reverse(CHANGELIST)).content.decode()
        assert all(f">{user.username}</span> <span" in content for user in users)
        return len(queries.captured_queries)

    assert queries_for(1) == queries_for(12)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"q": "carol"}, {"c-1", "c-2", "carol-in-a-key"}),
        ({"q": " Carol@Example.COM "}, {"c-1", "c-2"}),
        ({"q": "DAVE"}, {"d-1"}),
        ({"q": "carol", "status_class": "4xx"}, {"c-2"}),
        # Whole usernames only: a part matches keys, paths and principals as before.
        ({"q": "caro"}, {"carol-in-a-key"}),
        ({"q": "dave"}, {"d-1"}),
        ({"q": "nobody"}, set()),
    ],
)
def test_search_by_username_or_email_finds_the_users_records(
    admin_client: Client, query: dict[str, str], expected: set[str]
) -> None:
    carol = User.objects.create_user("carol", "carol@example.com")
    dave = User.objects.create_user("dave", "dave@example.com")
    IdempotencyRecordFactory.create(key="c-1", principal=f"auth.user:{carol.pk}")
    IdempotencyRecordFactory.create(key="c-2", principal=f"auth.user:{carol.pk}", status_code=422)
    IdempotencyRecordFactory.create(key="d-1", principal=f"auth.user:{dave.pk}")
    IdempotencyRecordFactory.create(key="carol-in-a-key", principal="svc:reports")
    IdempotencyRecordFactory.create(key="c-booking", principal=f"testapp.booking:{carol.pk}")
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert listed(response) == expected


def test_principal_helpers_without_users() -> None:
    assert principal_usernames([]) == {}
    assert principal_usernames(["svc:a", "auth.user:"]) == {}


# -- deleting a principal's records ----------------------------------------------


def test_delete_principal_records_asks_then_deletes_all_of_theirs(
    admin_client: Client, admin_user: User
) -> None:
    carol = User.objects.create_user("carol")
    principal = f"auth.user:{carol.pk}"
    selected = IdempotencyRecordFactory.create(key="c-live", principal=principal)
    IdempotencyRecordFactory.create(key="c-expired", principal=principal, expired=True)
    IdempotencyRecordFactory.create(key="c-reserved", principal=principal, in_progress=True)
    IdempotencyRecordFactory.create(key="c-elsewhere", principal=principal, location="shop-7")
    IdempotencyRecordFactory.create(key="c-delivery", principal=principal, kind="webhook")
    service = IdempotencyRecordFactory.create(key="svc-1", principal="svc:reports")
    IdempotencyRecordFactory.create(key="svc-2", principal="svc:reports")
    IdempotencyRecordFactory.create(key="someone-else", principal="auth.user:987654")
    IdempotencyRecordFactory.create(key="similar", principal=f"{principal}0")
    data = {"action": "delete_principal_records", "_selected_action": [selected.pk, service.pk]}

    page = admin_client.post(reverse(CHANGELIST), data)
    assert page.status_code == 200
    assert DJANGO_CONFIRMATION in [t.name for t in page.templates]
    content = page.content.decode()
    assert "<h1>Delete all records of these principals?</h1>" in content
    assert "<li>Idempotency records: 7</li>" in content  # Django's summary: all of theirs
    assert "selected or not, in every location" in content
    assert (
        '<span class="idempotency-token">carol</span> <span class="quiet">'
        f'<span class="idempotency-token">({principal})</span></span>: 5 records' in content
    )
    assert '<span class="idempotency-token">svc:reports</span>: 2 records' in content
    assert IdempotencyRecord.objects.count() == 9

    response = confirmed(admin_client, page)
    assert "Deleted every record of 2 principals (7 in all)." in response.content.decode()
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {
        "someone-else",
        "similar",
    }
    entries = LogEntry.objects.filter(action_flag=DELETION, user=admin_user)
    assert entries.count() == 7
    assert {e.change_message for e in entries} == {
        f"Deleted with every record of principal {principal}.",
        "Deleted with every record of principal svc:reports.",
    }
    assert {e.object_repr for e in entries} >= {
        f"c-live ({principal}, -)",
        "svc-2 (svc:reports, -)",
    }


def test_delete_principal_records_needs_the_delete_permission(
    secret_record: IdempotencyRecord,
) -> None:
    client = staff_client("reader", "view_idempotencyrecord", "view_stored_response")
    data = {"action": "delete_principal_records", "_selected_action": [secret_record.pk]}
    response = client.post(reverse(CHANGELIST), data)
    assert DJANGO_CONFIRMATION not in [t.name for t in response.templates]
    client.post(reverse(CHANGELIST), {**data, "post": "yes"})
    assert IdempotencyRecord.objects.filter(pk=secret_record.pk).exists()

    deleter = staff_client("deleter", "view_idempotencyrecord", "delete_idempotencyrecord")
    response = deleter.post(reverse(CHANGELIST), {**data, "post": "yes"}, follow=True)
    assert "Deleted every record of 1 principal (1 in all)." in response.content.decode()
    assert not IdempotencyRecord.objects.exists()


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


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner estimate")
@pytest.mark.parametrize(
    "url", [reverse_lazy(CHANGELIST), "/admin/idempotency_django/webhookdelivery/"]
)
def test_the_unfiltered_changelists_count_no_rows_on_postgres(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Each page lists one kind of row (a WHERE of its own): without a filter it is still
    the planner's estimate, not a COUNT(*) through millions of rows."""
    IdempotencyRecordFactory.create_batch(5)
    IdempotencyRecordFactory.create_batch(3, kind="webhook")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {IdempotencyRecord._meta.db_table}")
    monkeypatch.setattr(EstimatedCountPaginator, "exact_below", 0)
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(url).status_code == 200
    assert not [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(url, {"q": "nothing-like-this"}).status_code == 200
    assert [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]


DELIVERIES = "/admin/idempotency_django/webhookdelivery/"


@pytest.fixture
def deliveries() -> dict[str, IdempotencyRecord]:
    return {
        "accepted": IdempotencyRecordFactory.create(
            kind="webhook",
            key="msg_2Lh9",
            source="standard-webhooks",
            principal="webhook:" + "ab" * 32,
            method="POST",
            path="hooks/<str:token>/",
            response_body=b'{"run_id": "run-77"}',
        ),
        "running": IdempotencyRecordFactory.create(
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
    for text in ("msg_2Lh9", "standard-webhooks", "run-77", "evt_running"):
        assert text in html
    assert headings(listing) == [
        "Delivery id",
        "Source",
        "Trigger",
        "State",
        "Run id",
        "Received",
        "Expires",
    ]
    # The trigger digest: its first 12 hex digits, all of it on hover.
    assert f'<code title="{"ab" * 32}">{"ab" * 6}…</code>' in html
    # Requests are not listed among deliveries, nor deliveries among requests.
    assert all(record.key not in html for record in records.values())
    records_html = admin_client.get("/admin/idempotency_django/idempotencyrecord/").content.decode()
    assert "msg_2Lh9" not in records_html
    detail = admin_client.get(f"{DELIVERIES}{deliveries['accepted'].pk}/change/")
    assert detail.status_code == 200
    assert "run-77" in detail.content.decode() and "ab" * 32 in detail.content.decode()
    assert "Delivery id:" in detail.content.decode()
    assert 'name="_save"' not in detail.content.decode()
    assert deliveries["accepted"].token not in detail.content.decode()


def test_delivery_filters_and_search(
    admin_client: Client, deliveries: dict[str, IdempotencyRecord]
) -> None:
    by_source = admin_client.get(DELIVERIES + "?source=body").content.decode()
    assert "evt_running" in by_source and "msg_2Lh9" not in by_source
    searched = admin_client.get(DELIVERIES + "?q=msg_2L").content.decode()
    assert "msg_2Lh9" in searched and "evt_running" not in searched


def test_deliveries_list_reads_run_ids_without_a_query_per_row(admin_client: Client) -> None:
    def queries_for(count: int) -> int:
        IdempotencyRecord.objects.all().delete()
        IdempotencyRecordFactory.create_batch(
            count, kind="webhook", response_body=b'{"run_id": "run-9"}'
        )
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(DELIVERIES).content.decode().count("run-9") == count
        return len(queries.captured_queries)

    assert queries_for(1) == queries_for(10)


def test_delete_principal_records_covers_a_bounded_number_of_principals(
    admin_client: Client,
) -> None:
    most = record_admin.IdempotencyRecordAdmin.max_principals_per_deletion
    selected = [IdempotencyRecordFactory.create(principal=f"svc:{n}").pk for n in range(most + 1)]
    data = {"action": "delete_principal_records", "_selected_action": selected, "post": "yes"}
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    expected = f"belong to {most + 1} principals; select the records of at most {most}"
    assert expected in response.content.decode()
    assert IdempotencyRecord.objects.count() == most + 1


# -- the record's page: its title -------------------------------------------------


def test_the_record_page_is_titled_with_the_key_and_the_username(admin_client: Client) -> None:
    alice = User.objects.create_user("alice")
    record = IdempotencyRecordFactory.create(
        key="order-1001-move", principal=f"auth.user:{alice.pk}"
    )
    content = admin_client.get(change_url(record)).content.decode()
    assert "<title>order-1001-move by alice | View idempotency record |" in content
    assert "<h2>order-1001-move by alice</h2>" in content
    assert f"(auth.user:{alice.pk}, -)" not in content
    located = IdempotencyRecordFactory.create(
        key="k-2", principal="svc:billing", location="hotel-porto"
    )
    assert (
        "<h2>k-2 by svc:billing at hotel-porto</h2>"
        in admin_client.get(change_url(located)).content.decode()
    )
