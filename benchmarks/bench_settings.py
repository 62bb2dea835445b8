"""Settings of every benchmark: the example project's, as deployed, plus the switches below.

- ``ROOT_URLCONF`` adds the undecorated booking viewset at ``/bare/bookings/``,
  a login and a readiness view (``bench_urls.py``);
- ``DEBUG`` off; ``CONN_MAX_AGE`` from ``BENCH_CONN_MAX_AGE`` (default 600);
- a fast password hasher (HTTP Basic hashes the password on every request);
- the library's INFO log records built (``BENCH_LOG_LEVEL``), but sent nowhere;
- ``BENCH_SESSIONS=cache``: sessions in the Redis cache instead of the database;
- ``BENCH_MEMORY=1``: the package's in-memory store, to measure the library alone;
- ``BENCH_ENCRYPTION=1``: stored responses encrypted (``ENCRYPTION_KEY``, and a fallback);
- ``BENCH_SERVER_SIDE_BINDING=1``: PostgreSQL with Django's ``server_side_binding`` and
  psycopg's prepared statements (``prepare_threshold``: ``BENCH_PREPARE_THRESHOLD``, 0);
- ``BENCH_PEER``: another package protects ``/peer/bookings/`` as its README says
  (its middleware replaces this project's).
"""

import os

from example.settings import *  # noqa: F403
from example.settings import CACHES, DATABASES, IDEMPOTENCY, INSTALLED_APPS, MIDDLEWARE, REDIS_URL

ROOT_URLCONF = "bench_urls"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("BENCH_CONN_MAX_AGE", "600"))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        "idempotency_django": {
            "handlers": ["null"],
            "level": os.environ.get("BENCH_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        "django": {"handlers": ["null"], "level": "ERROR", "propagate": False},
    },
}

if os.environ.get("BENCH_SESSIONS") == "cache":
    assert REDIS_URL, "sessions in the cache need REDIS_URL"
    SESSION_ENGINE = "django.contrib.sessions.backends.cache"

if os.environ.get("BENCH_MEMORY") == "1":
    IDEMPOTENCY["STORE"] = "memory"
    # 256 entries at most: the heap (and its garbage collections) stays small.
    IDEMPOTENCY["STORE_OPTIONS"] = {"max_entries": 256}
    # The store is refused outside DEBUG and tests (E023); measuring it is the point here.
    SILENCED_SYSTEM_CHECKS = ["idempotency_django.E023"]
    # Its count_keys scans every entry: store work, not the library's. The benchmark's own
    # store counted nothing, so figures stay comparable; BENCH_MAX_KEYS below turns it on.
    IDEMPOTENCY["MAX_KEYS_PER_PRINCIPAL"] = None

if os.environ.get("BENCH_SERVER_SIDE_BINDING") == "1":
    # Not the library's to set: it does not own the connection (issue 36, decision 3).
    # psycopg prepares a statement once it has run this many times (0: at once).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True,
        prepare_threshold=int(os.environ.get("BENCH_PREPARE_THRESHOLD", "0")),
    )

if os.environ.get("BENCH_ENCRYPTION") == "1":
    # A key and a fallback, as during a rotation.
    IDEMPOTENCY["ENCRYPTION_KEY"] = "4d3YDn0v3HTs3KZ6_8yW5f1YzRq4b2dbr2nVn7u0yGA="
    IDEMPOTENCY["ENCRYPTION_KEY_FALLBACKS"] = ["pQ2m9k9mV4cL2xZbN7sX0aT6wE1rY3uI5oP8qA4sD6f="]

# BENCH_MAX_KEYS=0 turns MAX_KEYS_PER_PRINCIPAL off (its one count per first request),
# to compare with a version that did not count by default.
if "BENCH_MAX_KEYS" in os.environ:
    IDEMPOTENCY["MAX_KEYS_PER_PRINCIPAL"] = int(os.environ["BENCH_MAX_KEYS"]) or None

PEER = os.environ.get("BENCH_PEER", "")
if PEER:
    MIDDLEWARE.remove("idempotency_django.middleware.IdempotencyMiddleware")
if PEER == "drf-idempotency":
    INSTALLED_APPS.append("drf_idempotency")
    MIDDLEWARE.append("drf_idempotency.middleware.IdempotencyMiddleware")
    if os.environ.get("EXAMPLE_IDEMPOTENCY_BACKEND") == "redis":
        IDEMPOTENCY = {
            "BACKEND": "drf_idempotency.backends.redis.RedisBackend",
            "BACKEND_OPTIONS": {"url": REDIS_URL},
        }
    else:
        IDEMPOTENCY = {"BACKEND": "drf_idempotency.backends.database.DatabaseBackend"}
elif PEER == "django-idempotency-key":
    # Its only store shared between processes is a Django cache: Redis here.
    assert CACHES["default"]["BACKEND"] == "django_redis.cache.RedisCache"
    MIDDLEWARE.append("idempotency_key.middleware.ExemptIdempotencyKeyMiddleware")
    IDEMPOTENCY_KEY = {
        "STORAGE": {"CLASS": "idempotency_key.storage.CacheKeyStorage", "CACHE_NAME": "default"},
        "CONFLICT_STATUS_CODE": None,  # replay with the stored status, not 409
    }
elif PEER == "drf-idempotencykey":
    INSTALLED_APPS.append("drf_idempotencykey")
