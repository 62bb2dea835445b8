"""The Redis store end to end: through the middleware, against real Redis servers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core import checks
from django.db import connections
from django.test import AsyncClient, Client, override_settings

from idempotency_django import signals
from idempotency_django.checks import check_settings
from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import Outcome, RecordKey, StoreUnavailable, get_store
from idempotency_django.stores.contract import KEY, LOCK_TIMEOUT, REQUEST, RESPONSE
from idempotency_django.stores.redis import RedisStore
from tests.checkpoints import Checkpoint
from tests.redis_helpers import (
    ALIAS,
    REDIS_URL,
    caches_with,
    private_redis_server,
    raw_client,
    redis_cache,
    redis_store_settings,
    stored_entries,
)
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

URL = "/plain/bookings/"
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})


def post(client: Client, key: str = "booking-1", url: str = URL, **headers: Any) -> Any:
    return client.post(
        url, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **headers
    )


@pytest.fixture
def on_redis() -> Iterator[None]:
    with redis_store_settings():
        yield


# -- the key contract on Redis ---------------------------------------------------


@pytest.mark.usefixtures("on_redis")
def test_first_request_is_stored_in_redis_only(alice_client: Client) -> None:
    response = post(alice_client)
    assert response.status_code == 201
    assert "Idempotency-Replayed" not in response
    assert Booking.objects.count() == 1
    assert IdempotencyRecord.objects.count() == 0
    [(key, value)] = stored_entries().items()
    assert key.startswith(b"idempotency:v1:")
    assert value.startswith(b'{"v":1,"state":"completed",')
    assert value.endswith(b"\n" + response.content)
    assert 86390 < raw_client().ttl(key) <= 86400


@pytest.mark.usefixtures("on_redis")
def test_replay_is_byte_identical(alice_client: Client) -> None:
    first = post(alice_client)
    second = post(alice_client)
    assert second.status_code == 201
    assert second["Idempotency-Replayed"] == "true"
    assert second.content == first.content
    assert second["Content-Type"] == first["Content-Type"]
    assert second["Location"] == first["Location"]
    assert "session_hint" not in second.cookies
    assert "X-Debug-Only" not in second
    assert Booking.objects.count() == 1


@pytest.mark.usefixtures("on_redis")
def test_reuse_with_another_body_is_409(alice_client: Client) -> None:
    post(alice_client)
    response = alice_client.post(
        URL, json.dumps({"slot": "other"}), content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="booking-1",
    )  # fmt: skip
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


@pytest.mark.usefixtures("on_redis")
def test_5xx_is_released_so_the_retry_runs(alice_client: Client) -> None:
    assert post(alice_client, url=URL + "?status=500").status_code == 500
    assert stored_entries() == {}
    retry = post(alice_client, url=URL + "?status=500")
    assert "Idempotency-Replayed" not in retry
    assert Booking.objects.count() == 2


@pytest.mark.usefixtures("on_redis")
def test_users_never_share_entries(alice_client: Client, bob_client: Client) -> None:
    post(alice_client)
    assert "Idempotency-Replayed" not in post(bob_client)
    assert len(stored_entries()) == 2


@pytest.mark.usefixtures("on_redis")
def test_a_stored_value_holds_no_key_credential_or_cookie(alice_client: Client) -> None:
    raw_key = "raw-key-never-stored-7f3a9c"
    session_id = alice_client.cookies["sessionid"].value
    response = post(alice_client, key=raw_key, HTTP_AUTHORIZATION="Bearer very-secret-token-42")
    assert response.status_code == 201
    assert response.cookies["session_hint"].value == "secret-cookie-value"
    [(key, value)] = stored_entries().items()
    for secret in (raw_key, "very-secret-token-42", session_id, "secret-cookie-value"):
        assert secret.encode() not in key
        assert secret.encode() not in value
    head = json.loads(value.partition(b"\n")[0])
    names = {name.lower() for name, _ in head["headers"]}
    assert names == {"content-type", "location"}
    assert not names & {"set-cookie", "authorization", "cookie", "x-debug-only"}


@pytest.mark.parametrize(("limit", "first"), [(None, 2), (1000, 3)])
def test_round_trips_per_claim_and_replay(alice_client: Client, limit: Any, first: int) -> None:
    """Counted by the server: a first request sends 2 commands (3 with the key limit), a replay 1.

    (commandstats also counts the GET and SET the scripts run inside Redis.)
    """
    with private_redis_server() as (_process, port):
        caches = caches_with(private=redis_cache(f"redis://127.0.0.1:{port}/0"))
        with redis_store_settings(alias="private", caches=caches, MAX_KEYS_PER_PRINCIPAL=limit):
            server = redis.Redis(port=port)
            post(alice_client, key="warm-up")  # loads the scripts once
            post(alice_client, key="warm-up")
            server.config_resetstat()
            assert post(alice_client, key="measured").status_code == 201
            assert _round_trips(server) == first  # claim, (count_keys,) complete
            server.config_resetstat()
            assert post(alice_client, key="measured")["Idempotency-Replayed"] == "true"
            assert _round_trips(server) == 1  # claim, which returns the response
            server.close()


def _round_trips(server: redis.Redis) -> int:
    calls = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in server.info("commandstats").items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }
    # The store itself only ever sends EVALSHA; the rest ran inside the scripts.
    in_scripts = {"get", "set", "del", "publish", "time", "zadd", "zcard", "zrange"}
    assert set(calls) <= {"evalsha", "pexpire", "pexpireat", "zremrangebyscore", *in_scripts}, calls
    return calls["evalsha"]


@pytest.mark.usefixtures("on_redis")
def test_async_view_on_redis(alice: User) -> None:
    client = AsyncClient()
    client.force_login(alice)

    async def scenario() -> list[Any]:
        headers = {"Idempotency-Key": "async-redis-1"}
        return [
            await client.post("/async/bookings/", BODY, "application/json", headers=headers)
            for _ in range(2)
        ]

    first, replay = async_to_sync(scenario)()
    assert first.status_code == 201
    assert replay["Idempotency-Replayed"] == "true"
    assert replay.content == first.content
    assert Booking.objects.count() == 1
    assert len(stored_entries()) == 1


# -- a real outage -----------------------------------------------------------------


def test_a_dead_server_means_503_and_nothing_runs(alice_client: Client) -> None:
    with private_redis_server() as (process, port):
        caches = caches_with(outage=redis_cache(f"redis://127.0.0.1:{port}/0"))
        with redis_store_settings(alias="outage", caches=caches):
            assert post(alice_client, key="before").status_code == 201
            process.terminate()
            process.wait(timeout=5)

            started = time.monotonic()
            response = post(alice_client, key="after")
            elapsed = time.monotonic() - started
            assert response.status_code == 503
            assert response["Content-Type"] == "application/problem+json"
            assert response.json()["code"] == "idempotency_unavailable"
            assert response["Retry-After"] == "1"  # RETRY_AFTER
            assert elapsed < 3
            # Not even the stored response can be replayed: nothing runs.
            assert post(alice_client, key="before").status_code == 503
            assert Booking.objects.count() == 1


def test_a_server_lost_during_the_view_still_answers(
    alice_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Failure at completion: the work is done, the client gets it, the failure is logged."""
    with private_redis_server() as (process, port):
        caches = caches_with(fragile=redis_cache(f"redis://127.0.0.1:{port}/0"))
        with redis_store_settings(alias="fragile", caches=caches):

            def kill_server(**kwargs: Any) -> None:
                process.terminate()
                process.wait(timeout=5)

            # The key is claimed, the view has not run yet: the server goes away.
            signals.reserved.connect(kill_server, dispatch_uid="kill-redis")
            try:
                with caplog.at_level(logging.DEBUG, logger="idempotency_django"):
                    response = post(alice_client)
            finally:
                signals.reserved.disconnect(dispatch_uid="kill-redis")
            assert response.status_code == 201
            assert "Idempotency-Replayed" not in response
            assert Booking.objects.count() == 1
            events = [
                (r.levelname, r.idempotency["event"])
                for r in caplog.records
                if hasattr(r, "idempotency")
            ]
            assert events == [("DEBUG", "reserved"), ("ERROR", "store_failed")]


# -- real concurrency ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicates_run_once(alice: User) -> None:
    threads_count = 16
    clients = []
    for _ in range(threads_count):
        client = Client()
        client.force_login(alice)
        clients.append(client)
    barrier = threading.Barrier(threads_count)
    results: list[tuple[int, dict[str, Any], bool]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(client: Client) -> None:
        try:
            barrier.wait(timeout=10)
            # The one that claims the key waits in the view until the others are answered.
            response = post(client, key="concurrent-1", HTTP_X_PAUSE_AT="running")
            body = json.loads(response.content)
            with lock:
                results.append(
                    (response.status_code, body, response.get("Idempotency-Replayed") == "true")
                )
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    with redis_store_settings():
        threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
        with Checkpoint("running") as running:
            for thread in threads:
                thread.start()
            running.wait_until_reached()
            deadline = time.monotonic() + 30
            while len(results) + len(errors) < threads_count - 1:  # all but the first
                assert time.monotonic() < deadline, "the duplicates were not answered"
                time.sleep(0.01)
        for thread in threads:
            thread.join(timeout=30)

    assert errors == []
    assert len(results) == threads_count
    assert Booking.objects.count() == 1
    originals = [r for r in results if r[0] == 201 and not r[2]]
    replays = [r for r in results if r[0] == 201 and r[2]]
    in_progress = [r for r in results if r[0] == 409]
    assert len(originals) == 1
    assert in_progress, "the duplicates should have overlapped the slow original"
    assert all(r[1]["code"] == "idempotency_key_in_progress" for r in in_progress)
    assert all(r[1] == originals[0][1] for r in replays)
    assert len(originals) + len(replays) + len(in_progress) == threads_count
    assert not [r for r in results if r[0] >= 500]


# -- system checks ------------------------------------------------------------------


def _store_check_ids(
    caches: dict[str, Any], debug: bool = False, cache: str = "default", **idempotency: Any
) -> set[str]:
    with override_settings(
        CACHES=caches,
        DEBUG=debug,
        IDEMPOTENCY={"STORE": "redis", "STORE_OPTIONS": {"cache": cache}, **idempotency},
    ):
        messages = check_settings()
    assert all(isinstance(m, checks.CheckMessage) for m in messages)
    return {str(m.id) for m in messages}


LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def test_check_a_process_local_cache_is_an_error() -> None:
    assert _store_check_ids(LOCMEM) == {"idempotency_django.E020", "idempotency_django.E021"}


def test_check_a_process_local_cache_is_tolerated_in_debug_only_for_sharing() -> None:
    assert _store_check_ids(LOCMEM, debug=True) == {"idempotency_django.E020"}


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.dummy.DummyCache",
        "django.core.cache.backends.filebased.FileBasedCache",
    ],
)
def test_check_other_unshared_caches(backend: str) -> None:
    caches = {"default": {"BACKEND": backend, "LOCATION": "/tmp/idempotency-cache"}}
    assert "idempotency_django.E021" in _store_check_ids(caches)


def test_check_fakeredis_is_not_shared() -> None:
    caches = {"default": redis_cache("redis://x/0", REDIS_CLIENT_CLASS="fakeredis.FakeRedis")}
    assert _store_check_ids(caches) == {"idempotency_django.E021"}


def test_check_a_missing_alias() -> None:
    assert _store_check_ids(LOCMEM, cache="nope") == {"idempotency_django.E020"}


def test_check_djangos_own_redis_backend_is_not_enough() -> None:
    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
        }
    }
    assert _store_check_ids(caches) == {"idempotency_django.E020"}


def test_check_a_django_redis_cache_passes() -> None:
    assert _store_check_ids({"default": redis_cache(REDIS_URL)}) == set()


def test_check_unsupported_client_options() -> None:
    shard = redis_cache("redis://a/0", CLIENT_CLASS="django_redis.client.ShardClient")
    assert _store_check_ids({"default": shard}) == {"idempotency_django.E022"}
    decoding = redis_cache("redis://a/0")
    decoding["OPTIONS"]["CONNECTION_POOL_KWARGS"] = {"decode_responses": True}
    assert _store_check_ids({"default": decoding}) == {"idempotency_django.E022"}


def test_check_atomic_has_no_effect_on_redis() -> None:
    caches = {"default": redis_cache(REDIS_URL)}
    assert _store_check_ids(caches, ATOMIC=True) == {"idempotency_django.W020"}


def test_the_short_name_builds_the_store() -> None:
    with redis_store_settings():
        store = get_store()
        assert isinstance(store, RedisStore)
        assert store.alias == ALIAS and store.key_prefix == "idempotency"


def test_the_logged_key_digest_is_the_start_of_the_redis_key() -> None:
    from idempotency_django.stores.digests import key_digest

    store = RedisStore()
    key = RecordKey("auth.user:1", "portland", "booking-1")
    assert store.redis_key(key).startswith(
        "idempotency:v1:" + key_digest(key.principal, key.location, key.key)
    )
    assert RedisStore(key_prefix="shop").redis_key(key).startswith("shop:v1:")


@pytest.mark.parametrize(
    "foreign",
    [b"no newline", b"not json\n", b'{"v":2,"state":"in_progress","token":"t"}\nbody'],
    ids=["no-header", "bad-json", "format-2"],
)
def test_a_value_in_no_format_it_knows_is_nobodys(foreign: bytes) -> None:
    """Every script reads a value the same way: one not in format 1 holds no key."""
    with redis_store_settings():
        store, client = get_store(), raw_client()
        assert isinstance(store, RedisStore)
        redis_key = store.redis_key(KEY)
        client.set(redis_key, foreign)
        assert (store.peek(KEY), store.lookup(KEY)) == (None, None)
        # Not our reservation: complete, renew and release leave it as it is.
        assert store.complete(KEY, "t", RESPONSE, LOCK_TIMEOUT, request=REQUEST) is False
        assert store.renew(KEY, "t", LOCK_TIMEOUT, REQUEST) is False
        store.release(KEY, "t")
        assert client.get(redis_key) == foreign
        # A claim takes the key.
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED
        assert store.peek(KEY) is Outcome.IN_PROGRESS


# -- entries in format 1 that this store never writes: the store failing, never a 500 --


@pytest.mark.parametrize(
    "value",
    [
        b'{"v":1}\n',
        b'{"v":1,"state":"in_progress","fp":"x","status":"abc"}\n',
        b'{"v":1,"state":"completed","fp":"x","status":null,"headers":[]}\n',
    ],
    ids=["no-state", "status-text", "status-null"],
)
def test_a_malformed_entry_looked_up_is_the_store_failing(value: bytes) -> None:
    """What a waiting duplicate and a webhook's neighbouring buckets look at."""
    with redis_store_settings():
        store = get_store()
        raw_client().set(store.redis_key(KEY), value)  # type: ignore[attr-defined]
        with pytest.raises(StoreUnavailable):
            store.lookup(KEY)


@pytest.mark.parametrize(
    "head",
    [{"status": 1000}, {"status": 201, "headers": [["X-Bad", "a\nb"]]}],
    ids=["status-out-of-range", "header-with-a-line-break"],
)
def test_a_malformed_stored_answer_is_replayed_as_503(alice_client: Client, head: Any) -> None:
    """Django would refuse to send it: 503 idempotency_unavailable, nothing runs."""
    alice_client.raise_request_exception = False
    with redis_store_settings():
        assert post(alice_client, "malformed").status_code == 201
        [(redis_key, value)] = stored_entries().items()
        stored_head, _, stored_body = value.partition(b"\n")
        edited = {**json.loads(stored_head), **head}
        raw_client().set(redis_key, json.dumps(edited).encode() + b"\n" + stored_body, px=60_000)
        retry = post(alice_client, "malformed")
    assert (retry.status_code, retry.json()["code"]) == (503, "idempotency_unavailable")
    assert Booking.objects.count() == 1


# -- MAX_KEYS_PER_PRINCIPAL: the principal's index of keys -------------------------------


def test_a_short_lived_key_leaves_the_principal_index_to_its_longest_lived_one() -> None:
    with redis_store_settings(MAX_KEYS_PER_PRINCIPAL=5):
        store = get_store()
        week = RecordKey("auth.user:1", "", "a-7-day-view")
        second = RecordKey("auth.user:1", "", "a-1-second-view")
        assert store.count_keys(week, 7 * 86400)[0] == 1
        assert store.count_keys(second, 1)[0] == 2
        ttl = raw_client().pttl(store.principal_index(week))  # type: ignore[attr-defined]
    assert ttl > 6 * 86400 * 1000, "a key of one second would end the index, a week's key too"


def test_a_release_that_lost_its_key_leaves_the_new_holder_counted() -> None:
    """Its reservation expired and a retry took the key: the release is not of that one."""
    with redis_store_settings(MAX_KEYS_PER_PRINCIPAL=5):
        store, client = get_store(), raw_client()
        first = store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        store.count_keys(KEY, 600)
        client.delete(store.redis_key(KEY))  # type: ignore[attr-defined]  # it expired
        assert store.claim(KEY, REQUEST, LOCK_TIMEOUT).outcome is Outcome.CLAIMED
        store.release(KEY, first.token)
        index = store.principal_index(KEY)  # type: ignore[attr-defined]
        assert client.zscore(index, KEY.digest) is not None
