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

Only the cache's connection settings are used: the store talks to the raw
client from :func:`django_redis.get_redis_connection`, so the cache's
serializer, compressor, ``KEY_PREFIX`` and ``VERSION`` do not apply (and
nothing is ever pickled).

Key
    ``{key_prefix}:v1:{sha256(principal \\x1f location \\x1f key)}`` in hex.
    The raw idempotency key never reaches Redis, and a scope can only
    address its own entries. ``v1`` is the value format below; a new
    format gets a new key space.

Value (format 1)
    One Redis string: a one-line JSON header, a newline, then the response
    body as raw bytes (nothing is base64-encoded or pickled)::

        {"v":1,"state":"completed","token":"<32 hex>","fp":"<fingerprint>",
         "status":201,"headers":[["Content-Type","application/json"]]}\n<body>

    (the header is on one line). ``v`` is the format version, ``state`` is
    ``in_progress`` for a reservation (then ``status`` and ``headers`` are
    absent and the body is empty) or ``completed``; ``token`` is the owner's
    proof of ownership, ``fp`` the request fingerprint, ``headers`` the
    replayed headers in order; ``"omitted":true`` (present only then) marks
    a response larger than ``MAX_STORED_BODY``, whose body was not kept.
    A string is about half the memory of a hash with the same fields once
    the body passes 64 bytes (Redis then stops packing the hash).

    With ``ENCRYPTION_KEY`` set, ``headers`` is the one pair
    ``[":idempotency-encrypted","fernet-1"]`` and the body a Fernet token of
    the real headers and body (:mod:`idempotency_django.encryption`): the same
    format, so entries written before and after encryption was turned on live
    side by side.

    The key's TTL is the lock timeout while it is a reservation (an
    abandoned reservation is released by its expiry) and the retention once
    completed. Past it, Redis forgets the entry by itself.

Waiting
    complete and release publish on ``<key>:settled``, so a duplicate that
    waits for the first request (``WAIT_FOR_IN_PROGRESS``) subscribes
    instead of polling.

Atomicity
    claim, complete, release, renew and peek are each one Lua script (``EVALSHA``, so one
    round trip) touching one key. A claim that finds a completed entry
    returns the stored response at once, so a replay costs one round trip.
    complete only writes while our token still owns an in-progress entry, or
    (given the request) when the entry is gone because our reservation expired
    and nobody claimed the key since, as the database store keeps such a row;
    it never overwrites an entry another request took over;
    release only deletes such an entry.

Clients
    django-redis's ``DefaultClient`` (and ``HerdClient``, a subclass) and
    ``SentinelClient`` work (the store always uses the primary). Because each
    script touches a single key, a cache whose client class returns a
    ``redis.cluster.RedisCluster`` works too. ``ShardClient`` does not (it
    has no raw client). Do not set ``decode_responses``: bodies are bytes.

Failures
    Any Redis error (connection refused, timeout, a ``ResponseError``)
    raises :class:`~idempotency_django.stores.base.StoreUnavailable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string
from redis.commands.core import Script
from redis.exceptions import RedisClusterException, RedisError

from idempotency_django.conf import idempotency_settings
from idempotency_django.encryption import seal, unseal
from idempotency_django.stores.base import (
    BaseStore,
    Claim,
    KeyState,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)
from idempotency_django.stores.redis_scripts import (
    CLAIM_SCRIPT,
    COMPLETE_SCRIPT,
    COUNT_KEYS_SCRIPT,
    LOOKUP_SCRIPT,
    PEEK_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
)

FORMAT_VERSION = 1
IN_PROGRESS = "in_progress"
COMPLETED = "completed"

DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
#: Cache backends each process (or host) has on its own: a reservation made in
#: one worker would be invisible to the others.
NOT_SHARED_BACKENDS = frozenset(
    {
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.dummy.DummyCache",
        "django.core.cache.backends.filebased.FileBasedCache",
    }
)

_ERRORS = (RedisError, RedisClusterException)


@contextlib.contextmanager
def unavailable_on_error() -> Iterator[None]:
    """The one translation of the store's failures: Redis's errors become StoreUnavailable."""
    try:
        yield
    except _ERRORS as exc:
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc


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

    # -- the contract -------------------------------------------------------

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        token = uuid.uuid4().hex

        def run_claim(*other_fingerprints: str) -> Any:
            return self._run(
                "claim",
                CLAIM_SCRIPT,
                self.redis_key(key),
                request.fingerprint,
                _reservation(token, request.fingerprint),
                _milliseconds(lock_timeout),
                *other_fingerprints,
            )

        reply = run_claim()
        outcome = _text(reply[0])
        others = getattr(request.fingerprint, "alternatives", ())
        if outcome == "reused" and others:
            # Computed only now: most claims never need them.
            reply = run_claim(*others)
            outcome = _text(reply[0])
        if outcome == "claimed":
            return Claim(Outcome.CLAIMED, token=token)
        if outcome == "reused":
            return Claim(Outcome.REUSED)
        if outcome == "in_progress":
            return Claim(Outcome.IN_PROGRESS)
        if outcome == "replay":
            return Claim(Outcome.REPLAY, response=decode_response(reply[1]))
        raise StoreUnavailable(f"Unexpected reply from the claim script: {outcome!r}")

    def peek(self, key: RecordKey) -> Outcome | None:
        state = self._run("peek", PEEK_SCRIPT, self.redis_key(key))
        if state is None:
            return None
        return Outcome.REPLAY if _text(state) == COMPLETED else Outcome.IN_PROGRESS

    def complete(
        self,
        key: RecordKey,
        token: str,
        response: StoredResponse,
        retention: int,
        *,
        request: RequestInfo | None = None,
    ) -> bool:
        response = seal(response)
        headers = _header([list(pair) for pair in response.headers])
        reply = self._run(
            "complete",
            COMPLETE_SCRIPT,
            self.redis_key(key),
            token,
            _milliseconds(retention),
            str(response.status),
            headers,
            bytes(response.body),
            "1" if request is not None else "0",
            request.fingerprint if request is not None else "",
            "1" if response.body_omitted else "0",
        )
        return bool(reply == 1)

    def release(self, key: RecordKey, token: str) -> None:
        self._run("release", RELEASE_SCRIPT, self.redis_key(key), token)
        if idempotency_settings.MAX_KEYS_PER_PRINCIPAL:
            # A released key no longer counts against its principal. A separate
            # call: the index is another key, maybe on another cluster node.
            with unavailable_on_error():
                self.client().zrem(self.principal_index(key), key.digest)

    def lookup(self, key: RecordKey) -> KeyState | None:
        reply = self._run("lookup", LOOKUP_SCRIPT, self.redis_key(key))
        if reply is None:
            return None
        state, status, milliseconds = reply
        status = _text(status)
        return KeyState(
            state=_text(state),
            status=int(status) if status else None,
            expires_in=int(milliseconds) / 1000,
        )

    def wait(self, key: RecordKey, timeout: float) -> None:
        # complete and release publish on the entry's channel: no polling.
        deadline = time.monotonic() + timeout
        with unavailable_on_error():
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
        with unavailable_on_error():
            client = self.client()
            keys = list(client.scan_iter(match=f"{prefix}:v{FORMAT_VERSION}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])

    def count_keys(self, key: RecordKey, lifetime: int) -> tuple[int, float | None]:
        count, first_expiry = self._run(
            "count_keys",
            COUNT_KEYS_SCRIPT,
            self.principal_index(key),
            key.digest,
            _milliseconds(lifetime),
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
        reply = self._run(
            "renew",
            RENEW_SCRIPT,
            self.redis_key(key),
            token,
            _milliseconds(lock_timeout),
            _reservation(token, request.fingerprint),
            "1" if remake else "0",
        )
        return bool(reply == 1)

    def check(self) -> list[checks.CheckMessage]:
        where = f"IDEMPOTENCY['STORE_OPTIONS']['cache'] is {self.alias!r}"
        caches_setting: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {})
        config = caches_setting.get(self.alias)
        if config is None:
            return [
                checks.Error(
                    f"{where}, which is not in CACHES.",
                    hint="Add a django-redis cache (django_redis.cache.RedisCache) for it.",
                    id="idempotency_django.E020",
                )
            ]
        backend = str(config.get("BACKEND", ""))
        messages: list[checks.CheckMessage] = []
        if not _is_django_redis(backend):
            messages.append(
                checks.Error(
                    f"{where}, whose BACKEND {backend!r} is not django-redis.",
                    hint=f"The Redis store needs BACKEND {DJANGO_REDIS_BACKEND!r} "
                    "(Django's own redis backend has no raw client to run scripts on).",
                    id="idempotency_django.E020",
                )
            )
        if not settings.DEBUG and (backend in NOT_SHARED_BACKENDS or _is_fake(config)):
            messages.append(
                checks.Error(
                    f"{where}, which is not shared between processes: each worker would "
                    "see only its own reservations and run duplicates.",
                    hint="Point the store at a Redis server every worker uses.",
                    id="idempotency_django.E021",
                )
            )
        options = config.get("OPTIONS") or {}
        client_class = str(options.get("CLIENT_CLASS", ""))
        if client_class.endswith("ShardClient"):
            messages.append(
                checks.Error(
                    f"{where}, whose CLIENT_CLASS {client_class!r} has no raw client.",
                    hint="Use DefaultClient or SentinelClient (or a cluster client).",
                    id="idempotency_django.E022",
                )
            )
        if (options.get("CONNECTION_POOL_KWARGS") or {}).get("decode_responses"):
            messages.append(
                checks.Error(
                    f"{where}, whose connections decode responses; stored bodies are bytes.",
                    hint="Remove decode_responses from CONNECTION_POOL_KWARGS.",
                    id="idempotency_django.E022",
                )
            )
        user_settings = getattr(settings, "IDEMPOTENCY", None)
        if isinstance(user_settings, dict) and user_settings.get("MAX_STORED_BODY", 0) is None:
            messages.append(
                checks.Warning(
                    "IDEMPOTENCY['MAX_STORED_BODY'] is None with the Redis store: a response of "
                    "any size is kept as one Redis string, and replaying a large one blocks "
                    "Redis for every other client while it is sent.",
                    hint="Keep a limit (the default is 1 MiB).",
                    id="idempotency_django.W021",
                )
            )
        if not any(message.level >= checks.ERROR for message in messages):
            messages.extend(self._check_eviction(where))
        user_settings = getattr(settings, "IDEMPOTENCY", None)
        if isinstance(user_settings, dict) and user_settings.get("ATOMIC"):
            messages.append(
                checks.Warning(
                    "IDEMPOTENCY['ATOMIC'] has no effect with the Redis store: the stored "
                    "response cannot commit in the view's database transaction.",
                    hint="Use the database store where the work and its response must "
                    "commit together.",
                    id="idempotency_django.W020",
                )
            )
        return messages

    def _check_eviction(self, where: str) -> list[checks.CheckMessage]:
        """W022 when the server may evict live records to make room.

        Every record has a TTL, so ``volatile-*`` policies may evict them as
        readily as ``allkeys-*``: an evicted reservation or stored response
        lets a retry run the work again. Only ``noeviction`` makes a full
        server refuse writes instead (the claim then answers 503 and nothing
        runs). Without ``maxmemory`` nothing is evicted, whatever the policy.
        A server that cannot be reached is not this check's to report.
        """
        try:
            memory = self.client().info("memory")
        except Exception:  # down, or INFO refused: nothing to tell
            return []
        policy = _text(memory.get("maxmemory_policy", "noeviction"))
        if policy == "noeviction" or not int(memory.get("maxmemory", 0) or 0):
            return []
        return [
            checks.Warning(
                f"{where}, whose Redis server evicts keys when full (maxmemory-policy "
                f"{policy!r}): a live reservation or stored response can be evicted, and "
                "the retry it should have answered then runs the work again.",
                hint="Give the store a Redis with maxmemory-policy noeviction (a full "
                "server then answers 503 and nothing runs), or no maxmemory.",
                id="idempotency_django.W022",
            )
        ]

    # -- helpers ------------------------------------------------------------

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

    def _run(self, name: str, source: str, redis_key: str, *args: str | int | bytes) -> Any:
        with unavailable_on_error():
            client = self.client()
            script = self._scripts.get(name)
            if script is None:
                script = self._scripts[name] = client.register_script(source)
            return script(keys=[redis_key], args=list(args), client=client)


def _reservation(token: str, fingerprint: str) -> bytes:
    """The value of a reservation: its header line and an empty body."""
    head = {"v": FORMAT_VERSION, "state": IN_PROGRESS, "token": token, "fp": fingerprint}
    return _header(head) + b"\n"


def _milliseconds(seconds: int) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _header(value: Any) -> bytes:
    """Compact ASCII JSON: never a raw newline, whatever the header values hold."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def decode_response(value: Any) -> StoredResponse:
    """The response kept in a completed value (format 1), decrypted when it is."""
    head_bytes, _, body = _bytes(value).partition(b"\n")
    try:
        head = json.loads(head_bytes)
        stored = StoredResponse(
            status=int(head["status"]),
            headers=tuple((str(name), str(value)) for name, value in head.get("headers") or []),
            body=body,
            body_omitted=bool(head.get("omitted", False)),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise StoreUnavailable(f"A stored response could not be decoded: {exc}") from exc
    return unseal(stored)


def _is_django_redis(backend: str) -> bool:
    if backend == DJANGO_REDIS_BACKEND:
        return True
    try:
        from django_redis.cache import RedisCache

        backend_class = import_string(backend)
    except ImportError:
        return False
    return isinstance(backend_class, type) and issubclass(backend_class, RedisCache)


def _is_fake(config: dict[str, Any]) -> bool:
    """A django-redis cache wired to fakeredis, which lives in one process."""
    options = config.get("OPTIONS") or {}
    pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
    suspects = (options.get("REDIS_CLIENT_CLASS"), pool_kwargs.get("connection_class"))
    return any("fakeredis" in repr(suspect) for suspect in suspects if suspect is not None)
