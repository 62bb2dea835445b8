"""Tasks run in-process by views, through a real server (uvicorn): ATOMIC_REQUESTS, a real
login with CSRF enforced, the real middleware, the Redis store with a fast heartbeat."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests import servers
from tests.redis_helpers import REDIS_URL, raw_client, skip_without_redis
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(transactional_db: None) -> Iterator[str]:
    pytest.importorskip("django_tasks_db")
    skip_without_redis()
    raw_client().flushdb()
    with servers.test_project_on_uvicorn(
        "tests.task_view_settings", TESTS_REDIS_URL=REDIS_URL
    ) as url:
        yield url
    raw_client().flushdb()


def post(url: str, user: User, slot: str, key: str) -> tuple[int, dict[str, Any]]:
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Idempotency-Key": key,
        **servers.logged_in_headers(user),
    }
    status, answer_headers, body = servers.post(url, f"slot={slot}".encode(), headers)
    is_json = "json" in answer_headers.get("Content-Type", "")
    return status, json.loads(body) if is_json else {}


def test_a_task_key_reused_by_another_user_is_a_409_never_a_500(server: str) -> None:
    """Two users who pick the same key: under the client's raw key, the second one's
    task refuses it (409 problem); under downstream_key each user's key is their own."""
    alice = User.objects.create_user("alice", password="pw")
    mallory = User.objects.create_user("mallory", password="pw")
    assert post(server + "/tasks/raw-key/", alice, "09:00", "k1")[0] == 201
    status, problem = post(server + "/tasks/raw-key/", mallory, "10:00", "k1")
    assert (status, problem["code"]) == (409, "idempotency_key_reused")

    assert post(server + "/tasks/downstream-key/", alice, "11:00", "k2")[0] == 201
    assert post(server + "/tasks/downstream-key/", mallory, "12:00", "k2")[0] == 201
    assert sorted(Booking.objects.values_list("slot", flat=True)) == [
        "09:00",
        "11:00",
        "12:00",
    ]


def test_an_immediate_task_in_a_rolled_back_request_frees_its_key_after_lock_timeout(
    server: str,
) -> None:
    """The task ran in the request's transaction; the view then failed (500, rolled
    back). Its key is free LOCK_TIMEOUT (1 s) later, not MAX_RUN_TIME (30 s)."""
    alice = User.objects.create_user("alice", password="pw")
    assert post(server + "/tasks/now/?fail=1", alice, "09:00", "first")[0] == 500
    assert Booking.objects.count() == 0
    time.sleep(2.5)  # LOCK_TIMEOUT and a few beats: renewed, it would still be held
    assert post(server + "/tasks/now/", alice, "09:00", "second") == (201, {"status": "SUCCESSFUL"})
    assert Booking.objects.count() == 1
