"""The test settings for tests/test_task_views.py's server: ATOMIC_REQUESTS, the Redis
store with a fast heartbeat, and tests/task_view_urls.py."""

import os

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.task_view_urls"
DATABASES["default"]["ATOMIC_REQUESTS"] = True  # noqa: F405
CACHES = {
    **CACHES,  # noqa: F405
    "idempotency": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("TESTS_REDIS_URL", "redis://127.0.0.1:6379/15"),
    },
}
IDEMPOTENCY = {
    "STORE": "redis",
    "STORE_OPTIONS": {"cache": "idempotency"},
    "LOCK_TIMEOUT": 1,
    "HEARTBEAT": {"INTERVAL": 0.2, "MAX_RUN_TIME": 30},
}
