"""Shared helpers for the Redis store tests: a test database, settings, a private server."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from idempotency_django.stores import get_store

#: The shared test server; DB 15 is flushed around every test that uses it.
REDIS_URL = os.environ.get("TESTS_REDIS_URL", "redis://127.0.0.1:6379/15")
ALIAS = "idempotency"
DOWN_ALIAS = "idempotency-down"
FAST_FAIL = {
    "SOCKET_CONNECT_TIMEOUT": 0.2,
    "SOCKET_TIMEOUT": 0.5,
    # One quick retry instead of redis-py's ten with backoff.
    "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 1)},
}


def redis_cache(location: str, **options: Any) -> dict[str, Any]:
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "OPTIONS": {**FAST_FAIL, **options},
    }


def redis_unreachable_reason() -> str | None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping()
    except redis.RedisError as exc:
        return f"Redis is not reachable at {REDIS_URL} ({type(exc).__name__}); start redis-server"
    return None


def skip_without_redis() -> None:
    reason = redis_unreachable_reason()
    if reason is not None:
        pytest.skip(reason)


def raw_client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def caches_with(**extra: dict[str, Any]) -> dict[str, Any]:
    """The test CACHES plus the Redis store's alias and an alias nobody listens on."""
    return {
        **settings.CACHES,
        ALIAS: redis_cache(REDIS_URL),
        DOWN_ALIAS: redis_cache("redis://127.0.0.1:1/0"),
        **extra,
    }


@contextlib.contextmanager
def redis_store_settings(
    alias: str = ALIAS, caches: dict[str, Any] | None = None, **idempotency: Any
) -> Iterator[None]:
    """STORE=redis on ``alias``, with DB 15 flushed before and after."""
    skip_without_redis()
    client = raw_client()
    client.flushdb()
    try:
        with override_settings(
            CACHES=caches or caches_with(),
            IDEMPOTENCY={"STORE": "redis", "STORE_OPTIONS": {"cache": alias}, **idempotency},
        ):
            get_store.cache_clear()
            yield
    finally:
        get_store.cache_clear()
        client.flushdb()
        client.close()


def raw_value(client: redis.Redis, key: bytes | str) -> bytes:
    """What ``key`` holds, as bytes (b"" if nothing): a raw client never decodes."""
    value = client.get(key)
    assert value is None or isinstance(value, bytes), value
    return value or b""


def stored_entries(client: redis.Redis | None = None) -> dict[bytes, bytes]:
    """Every record the store wrote (under the default prefix), not the principals' key indexes."""
    client = client or raw_client()
    return {
        key: raw_value(client, key)
        for key in client.scan_iter(match="idempotency:*")
        if b":principal:" not in key
    }


#: No persistence and no daemon: the process is the server, and killing it loses everything.
SERVER_ARGUMENTS = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def private_redis_server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A redis-server of our own, without persistence, that a test may kill."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed, so no private server can be started")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), *SERVER_ARGUMENTS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 5
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("the private redis-server did not start")
                time.sleep(0.02)
        client.close()
        yield process, port
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=5)
