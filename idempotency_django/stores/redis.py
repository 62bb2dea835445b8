"""A Redis store, through django-redis: replays stay off the primary database.

Configure it with a django-redis cache alias::

    CACHES = {
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://redis:6379/2",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        }
    }
    IDEMPOTENCY = {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}

Only the cache's connection is used: the store talks to the raw client from
:func:`django_redis.get_redis_connection`, so the cache's serializer, compressor,
``KEY_PREFIX`` and ``VERSION`` do not apply (and nothing is ever pickled).

An entry is one Redis string at ``{key_prefix}:v1:{record digest}`` (the raw key never
reaches Redis), in :mod:`~idempotency_django.stores.redis_values`' format; its TTL is the
lock timeout while it is a reservation, the retention once completed. Each step is one
Lua script on that one key (:mod:`~idempotency_django.stores.redis_scripts`): atomic, one
round trip (a replay costs one), and a cluster's node holds the whole of it. complete and
release publish on ``<key>:settled``, so a waiting duplicate subscribes instead of polling.
docs/stores.md is the reference: the value format, encryption, the django-redis clients
that work, Redis Cluster, failures.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any

from django.core import checks
from redis.commands.core import Script
from redis.exceptions import RedisClusterException, RedisError

from idempotency_django.conf import idempotency_settings
from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    unavailable_on,
)
from idempotency_django.stores.encryption import seal
from idempotency_django.stores.redis_checks import redis_store_checks
from idempotency_django.stores.redis_scripts import (
    CLAIM_SCRIPT,
    COMPLETE_SCRIPT,
    COUNT_KEYS_SCRIPT,
    LOOKUP_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
)
from idempotency_django.stores.redis_values import (
    COMPLETED,
    FORMAT_VERSION,
    IN_PROGRESS,
    compact_json,
    decode_response,
    milliseconds,
    reservation,
    text,
)

#: What the store's failures raise: each becomes StoreUnavailable.
_ERRORS = (RedisError, RedisClusterException)


class RedisStore(BaseStore):
    """Reservations and stored responses as Redis strings that expire by themselves."""

    expires_by_itself = True
    counts_keys = True

    def __init__(
        self, cache: str = "default", key_prefix: str = "idempotency", **options: Any
    ) -> None:
        super().__init__(**options)
        self.alias = cache
        self.key_prefix = key_prefix
        self._scripts: dict[str, Script] = {}

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        token, fingerprint = secrets.token_hex(16), request.fingerprint
        args = (fingerprint, reservation(token, fingerprint), milliseconds(lock_timeout))
        reply = self._run(CLAIM_SCRIPT, self.redis_key(key), *args)
        others = getattr(fingerprint, "alternatives", ())
        if text(reply[0]) == "reused" and others:
            # Computed only now: most claims never need them.
            reply = self._run(CLAIM_SCRIPT, self.redis_key(key), *args, *others)
        # The script answers with an Outcome's value; anything else is a failed store.
        with unavailable_on(ValueError):
            outcome = Outcome(text(reply[0]))
        if outcome is Outcome.REPLAY:
            return Claim(outcome, response=decode_response(reply[1], key, request.kind))
        return Claim(outcome, token=token if outcome is Outcome.CLAIMED else "")

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        response = seal(response, key, request.kind if request is not None else "request")
        headers = compact_json([list(pair) for pair in response.headers])
        reply = self._run(
            COMPLETE_SCRIPT,
            self.redis_key(key),
            token,
            milliseconds(retention),
            str(response.status),
            headers,
            bytes(response.body),
            "1" if request is not None else "0",
            request.fingerprint if request is not None else "",
            "1" if response.body_omitted else "0",
        )
        return bool(reply == 1)

    def release(self, key: RecordKey, token: str) -> None:
        released = self._run(RELEASE_SCRIPT, self.redis_key(key), token) == 1
        if released and idempotency_settings.MAX_KEYS_PER_PRINCIPAL:
            # A released key no longer counts against its principal (a key taken over
            # since is another's, and still counts). A separate call: the index is
            # another key, maybe on another cluster node.
            with unavailable_on(*_ERRORS):
                self.client().zrem(self.principal_index(key), key.digest)

    def lookup(self, key: RecordKey) -> KeyState | None:
        reply = self._run(LOOKUP_SCRIPT, self.redis_key(key))
        if reply is None:
            return None
        # An entry this store did not write (no state, a status that is no number) is
        # the store failing, as a claim of it is: never a 500 in a waiting duplicate.
        with unavailable_on(ValueError, TypeError):
            state, status, ttl = (text(part) for part in reply)
            status_code = int(status) if status else None
            if state not in (IN_PROGRESS, COMPLETED):
                raise ValueError(f"state {state!r}")
            return KeyState(state, status_code, expires_in=int(ttl) / 1000)

    def wait(self, key: RecordKey, timeout: float) -> None:
        # complete and release publish on the entry's channel: no polling.
        deadline = time.monotonic() + timeout
        with unavailable_on(*_ERRORS):
            subscription = self.client().pubsub(ignore_subscribe_messages=True)
            try:
                subscription.subscribe(self.redis_key(key) + ":settled")
                while self.is_held(key):  # looked at once subscribed: nothing is missed
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    subscription.get_message(timeout=remaining)
            finally:
                subscription.close()

    def clear(self) -> None:
        # SCAN for the store's own keys, never FLUSHDB: the cache's database may
        # hold anything else.
        prefix = re.sub(r"([*?\[\]\\])", r"\\\1", self.key_prefix)
        with unavailable_on(*_ERRORS):
            client = self.client()
            keys = list(client.scan_iter(match=f"{prefix}:v{FORMAT_VERSION}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        count, first_expiry = self._run(
            COUNT_KEYS_SCRIPT, self.principal_index(key), key.digest, milliseconds(lifetime)
        )
        return int(count), (int(first_expiry) / 1000 if int(first_expiry) >= 0 else None)

    def renew(
        self,
        key: RecordKey,
        token: str,
        lock_timeout: int,
        request: RequestInfo,
        *,
        remake: bool = True,
    ) -> bool:
        value = reservation(token, request.fingerprint)  # should it have to be made again
        args = (token, milliseconds(lock_timeout), value, "1" if remake else "0")
        return bool(self._run(RENEW_SCRIPT, self.redis_key(key), *args) == 1)

    def check(self) -> list[checks.CheckMessage]:
        return list(redis_store_checks(self.alias, self.client))

    def redis_key(self, key: RecordKey) -> str:
        """The Redis key of ``key``: its scope and value, hashed."""
        return f"{self.key_prefix}:v{FORMAT_VERSION}:{key.digest}"

    def principal_index(self, key: RecordKey) -> str:
        """The sorted set of a principal's keys, kept only under ``MAX_KEYS_PER_PRINCIPAL``."""
        principal = hashlib.sha256(key.principal.encode("utf-8", "surrogateescape")).hexdigest()
        return f"{self.key_prefix}:v{FORMAT_VERSION}:principal:{principal}"

    def client(self) -> Any:
        """The raw redis-py client of the cache (looked up each time: it is per thread)."""
        from django_redis import get_redis_connection

        return get_redis_connection(self.alias, write=True)

    def _run(self, source: str, redis_key: str, *args: str | int | bytes) -> Any:
        with unavailable_on(*_ERRORS):
            client = self.client()
            script = self._scripts.get(source)
            if script is None:
                script = self._scripts[source] = client.register_script(source)
            return script(keys=[redis_key], args=list(args), client=client)
