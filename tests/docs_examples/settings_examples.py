"""Settings the documentation shows; tests/test_docs.py checks each one with Django's checks."""

from __future__ import annotations

from typing import Any

# --8<-- [start:everything]
IDEMPOTENCY = {
    "ENABLED": True,
    "STORE": "database",
    "STORE_OPTIONS": {},
    "HEADER": "Idempotency-Key",
    "LOCATION_HEADER": "X-Location-Id",
    "METHODS": ("POST", "PUT", "PATCH", "DELETE"),
    "SCOPE_FUNCTION": "idempotency_django.protocol.scope.default_scope",
    "FINGERPRINT_FUNCTION": "idempotency_django.protocol.fingerprint.default_fingerprint",
    "LOCK_TIMEOUT": 300,
    "RETENTION": 86400,
    "HEARTBEAT": None,
    "MAX_RUN_TIME": 300,
    "WAIT_FOR_IN_PROGRESS": 0,
    "MAX_WAITERS_PER_KEY": 1,
    "MAX_WAITERS": 2,
    "MAX_STORED_BODY": 1024 * 1024,
    "MAX_KEYS_PER_PRINCIPAL": None,
    "MAX_FINGERPRINTED_BODY": 10 * 1024 * 1024,
    "RETAIN_CLIENT_ERRORS": False,
    "RETAIN_FUNCTION": None,
    "REQUIRED": False,
    "REQUIRED_PATHS": (),
    "ATOMIC": False,
    "REUSE_STATUS": 409,
    "RETRY_AFTER": 1,
    "UNAVAILABLE_RETRY_AFTER": 5,
    "ANONYMOUS": "ignore",
    "ENCRYPTION_KEY": None,
    "ENCRYPTION_KEY_FALLBACKS": (),
    "REPLAY_HEADERS": (
        "Content-Type",
        "Content-Encoding",
        "Content-Language",
        "Content-Location",
        "Location",
        "ETag",
        "Last-Modified",
        "Link",
        "Cache-Control",
        "Expires",
        "Vary",
    ),
    "REPLAYED_HEADER": "Idempotency-Replayed",
    "ECHO_KEY_HEADER": None,
    "IGNORED_KEY_HEADER": "Idempotency-Key-Ignored",
    "PROBLEM_TYPE_BASE": None,
    "PROBLEM_RENDERER": "idempotency_django.protocol.problems.render_problem",
    "DRF_EXCEPTION_HANDLER": False,
    "REPLAY_HOOK": None,
    "REQUEST_ID_HEADER": None,
    "WEBHOOK_ID_HEADER": None,
    "WEBHOOK_BODY_ID_FUNCTION": None,
    "WEBHOOK_RETENTION": 7 * 24 * 3600,
    "WEBHOOK_FALLBACK_BUCKET": 300,
    "WEBHOOK_TOKEN_KWARG": "token",
    "TASK_DUPLICATES": "wait",
}
# --8<-- [end:everything]

EVERYTHING = IDEMPOTENCY

# --8<-- [start:atomic]
from psycopg import IsolationLevel  # noqa: E402

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "bookings",
        "ATOMIC_REQUESTS": True,  # the view's writes and its stored response commit together
        # PostgreSQL's default, stated: other requests must see a claim at once.
        "OPTIONS": {"isolation_level": IsolationLevel.READ_COMMITTED},
    }
}
# Or, without ATOMIC_REQUESTS, for every protected view:
IDEMPOTENCY = {"ATOMIC": True}
# --8<-- [end:atomic]

ATOMIC_DATABASES: dict[str, dict[str, Any]] = DATABASES
ATOMIC = IDEMPOTENCY

# --8<-- [start:strict]
IDEMPOTENCY = {
    "REQUIRED": True,  # 400 idempotency_key_missing without a key (@idempotent, DRF)
    "REQUIRED_PATHS": [r"^/api/"],  # ...and on the plain views under /api/
    "ANONYMOUS": "reject",  # 401 for a keyed request nobody authenticated
    "REUSE_STATUS": 422,  # as the IETF draft says, instead of 409
    "RETAIN_CLIENT_ERRORS": True,  # replay 400/404/422 too (never 401/403/408/409/429)
}
# --8<-- [end:strict]

STRICT = IDEMPOTENCY

# --8<-- [start:webhook_headers]
IDEMPOTENCY = {
    # For receivers that name no id: the one header every sender you use signs.
    "WEBHOOK_ID_HEADER": "webhook-id",
}
# --8<-- [end:webhook_headers]

WEBHOOK_HEADERS = IDEMPOTENCY

# --8<-- [start:stripe]
IDEMPOTENCY = {
    # Stripe sends no delivery header; its event id is in the body.
    "WEBHOOK_BODY_ID_FUNCTION": "idempotency_django.webhooks.stripe_event_id",
}
# --8<-- [end:stripe]

STRIPE = IDEMPOTENCY

# --8<-- [start:body_id_function]
import json  # noqa: E402
import os  # noqa: E402


def paddle_notification_id(request):
    """For WEBHOOK_BODY_ID_FUNCTION: the delivery id from the body, or None."""
    try:
        payload = json.loads(request.body)
    except ValueError:
        return None
    return payload.get("notification_id") if isinstance(payload, dict) else None


IDEMPOTENCY = {
    "WEBHOOK_BODY_ID_FUNCTION": "myproject.webhooks.paddle_notification_id",
}
# --8<-- [end:body_id_function]

BODY_ID_FUNCTION = {"WEBHOOK_BODY_ID_FUNCTION": f"{__name__}.paddle_notification_id"}


# --8<-- [start:retain_function]
def keep_not_found_deletes(request, response, exception):
    """For RETAIN_FUNCTION: keep 2xx and 3xx, and a DELETE's 404 (it is gone either way)."""
    if request.method == "DELETE" and response.status_code == 404:
        return True
    return response.status_code < 400


IDEMPOTENCY = {
    "RETAIN_FUNCTION": "myproject.idempotency.keep_not_found_deletes",
}
# --8<-- [end:retain_function]

RETAIN_FUNCTION = {"RETAIN_FUNCTION": f"{__name__}.keep_not_found_deletes"}

# --8<-- [start:database_store]
IDEMPOTENCY = {
    "STORE": "database",
    "STORE_OPTIONS": {"database": "default"},  # a DATABASES alias
}
# --8<-- [end:database_store]

DATABASE_STORE = IDEMPOTENCY

# --8<-- [start:async_claim_commit]
IDEMPOTENCY = {
    "STORE": "database",
    "STORE_OPTIONS": {"database": "default", "async_claim_commit": True},
}
# --8<-- [end:async_claim_commit]

ASYNC_CLAIM_COMMIT = IDEMPOTENCY

# --8<-- [start:redis_store]
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "idempotency": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:6379/2",
        "OPTIONS": {
            # Without these, a Redis that stops answering stalls requests.
            "SOCKET_CONNECT_TIMEOUT": 1,
            "SOCKET_TIMEOUT": 1,
        },
    },
}

IDEMPOTENCY = {
    "STORE": "redis",
    "STORE_OPTIONS": {
        "cache": "idempotency",  # a CACHES alias using django-redis (default: "default")
        "key_prefix": "idempotency",  # first part of every Redis key (the default)
    },
}
# --8<-- [end:redis_store]

REDIS_CACHES = CACHES
REDIS_STORE = IDEMPOTENCY

# What a deployment's environment holds; never keys written in a repository.
os.environ.setdefault("IDEMPOTENCY_ENCRYPTION_KEY", "cw_0x689RpI-jtRR7oOSbnFPs2jEWyZRe5A3ncnJZAk=")
os.environ.setdefault(
    "IDEMPOTENCY_ENCRYPTION_OLD_KEYS", "6hGYnzfVH-mEhYmTRLWgA9EDWaLIdIobLsnJAzomtcs="
)

# --8<-- [start:encryption]
IDEMPOTENCY = {
    # From the environment, never the repository: a key made by generate_key().
    "ENCRYPTION_KEY": os.environ["IDEMPOTENCY_ENCRYPTION_KEY"],
    # During a rotation, the keys it replaces (comma-separated), until their records expire.
    "ENCRYPTION_KEY_FALLBACKS": [
        key for key in os.environ.get("IDEMPOTENCY_ENCRYPTION_OLD_KEYS", "").split(",") if key
    ],
}
# --8<-- [end:encryption]

ENCRYPTION = IDEMPOTENCY

#: Every IDEMPOTENCY example above, by name, for tests/test_docs.py.
EXAMPLES: dict[str, dict[str, Any]] = {
    "everything": EVERYTHING,
    "atomic": ATOMIC,
    "strict": STRICT,
    "webhook_headers": WEBHOOK_HEADERS,
    "stripe": STRIPE,
    "body_id_function": BODY_ID_FUNCTION,
    "retain_function": RETAIN_FUNCTION,
    "database_store": DATABASE_STORE,
    "async_claim_commit": ASYNC_CLAIM_COMMIT,
    "encryption": ENCRYPTION,
}
