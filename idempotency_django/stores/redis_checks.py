"""The system checks of the Redis store: its cache, its client and its server's eviction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from idempotency_django.stores.redis_values import text

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


def redis_store_checks(alias: str, client: Callable[[], Any]) -> Iterator[checks.CheckMessage]:
    """The errors and warnings of a ``RedisStore`` on the cache ``alias``.

    ``client`` returns the store's raw redis-py client, asked only for the eviction check.
    """
    where = f"IDEMPOTENCY['STORE_OPTIONS']['cache'] is {alias!r}"
    config = getattr(settings, "CACHES", {}).get(alias)
    if config is None:
        yield checks.Error(
            f"{where}, which is not in CACHES.",
            hint="Add a django-redis cache (django_redis.cache.RedisCache) for it.",
            id="idempotency_django.E020",
        )
        return
    user = getattr(settings, "IDEMPOTENCY", None)
    user = user if isinstance(user, dict) else {}
    if user.get("ATOMIC"):
        yield checks.Warning(
            "IDEMPOTENCY['ATOMIC'] has no effect with the Redis store: the stored "
            "response cannot commit in the view's database transaction.",
            hint="Use the database store where the work and its response must commit together.",
            id="idempotency_django.W020",
        )
    if user.get("MAX_STORED_BODY", 0) is None:
        yield checks.Warning(
            "IDEMPOTENCY['MAX_STORED_BODY'] is None with the Redis store: a response of "
            "any size is kept as one Redis string, and replaying a large one blocks "
            "Redis for every other client while it is sent.",
            hint="Keep a limit (the default is 1 MiB).",
            id="idempotency_django.W021",
        )
    errors = list(_configuration_errors(where, config))
    yield from errors
    if not errors:
        yield from _eviction_checks(where, client)


def _configuration_errors(where: str, config: dict[str, Any]) -> Iterator[checks.CheckMessage]:
    backend = str(config.get("BACKEND", ""))
    options = config.get("OPTIONS") or {}
    pool_kwargs = options.get("CONNECTION_POOL_KWARGS") or {}
    client_class = str(options.get("CLIENT_CLASS", ""))
    # fakeredis lives in one process.
    fake = any(
        "fakeredis" in repr(suspect)
        for suspect in (options.get("REDIS_CLIENT_CLASS"), pool_kwargs.get("connection_class"))
        if suspect is not None
    )
    if not _is_django_redis(backend):
        yield checks.Error(
            f"{where}, whose BACKEND {backend!r} is not django-redis.",
            hint=f"The Redis store needs BACKEND {DJANGO_REDIS_BACKEND!r} "
            "(Django's own redis backend has no raw client to run scripts on).",
            id="idempotency_django.E020",
        )
    if not settings.DEBUG and (backend in NOT_SHARED_BACKENDS or fake):
        yield checks.Error(
            f"{where}, which is not shared between processes: each worker would "
            "see only its own reservations and run duplicates.",
            hint="Point the store at a Redis server every worker uses.",
            id="idempotency_django.E021",
        )
    if client_class.endswith("ShardClient"):
        yield checks.Error(
            f"{where}, whose CLIENT_CLASS {client_class!r} has no raw client.",
            hint="Use DefaultClient or SentinelClient (or a cluster client).",
            id="idempotency_django.E022",
        )
    if pool_kwargs.get("decode_responses"):
        yield checks.Error(
            f"{where}, whose connections decode responses; stored bodies are bytes.",
            hint="Remove decode_responses from CONNECTION_POOL_KWARGS.",
            id="idempotency_django.E022",
        )


def _eviction_checks(where: str, client: Callable[[], Any]) -> Iterator[checks.CheckMessage]:
    """W022 when the server may evict live records to make room.

    Every record has a TTL, so ``volatile-*`` policies may evict them as
    readily as ``allkeys-*``: an evicted reservation or stored response
    lets a retry run the work again. Only ``noeviction`` makes a full
    server refuse writes instead (the claim then answers 503 and nothing
    runs). Without ``maxmemory`` nothing is evicted, whatever the policy.
    A server that cannot be reached is not this check's to report.
    """
    try:
        memory = client().info("memory")
    except Exception:  # down, or INFO refused: nothing to tell
        return
    policy = text(memory.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction" and int(memory.get("maxmemory", 0) or 0):
        yield checks.Warning(
            f"{where}, whose Redis server evicts keys when full (maxmemory-policy "
            f"{policy!r}): a live reservation or stored response can be evicted, and "
            "the retry it should have answered then runs the work again.",
            hint="Give the store a Redis with maxmemory-policy noeviction (a full "
            "server then answers 503 and nothing runs), or no maxmemory.",
            id="idempotency_django.W022",
        )


def _is_django_redis(backend: str) -> bool:
    if backend == DJANGO_REDIS_BACKEND:
        return True
    try:
        from django_redis.cache import RedisCache

        backend_class = import_string(backend)
    except ImportError:
        return False
    return isinstance(backend_class, type) and issubclass(backend_class, RedisCache)
