"""The test project as tests/test_security_round4.py's servers run it (issue 37).

``ROUND4_ENCRYPTION_KEY``: ``ENCRYPTION_KEY``. ``ROUND4_LOG``: the library's lines, every
level, to that file. ``ROUND4_REDIS_URL``: the Redis store there instead of the database
store. ``ROUND4_SECRET_KEY`` and ``ROUND4_SECRET_KEY_FALLBACKS`` (comma-separated): a
rotation. ``X-Request-Id`` is the request id header.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import SECRET_KEY

SECRET_KEY = os.environ.get("ROUND4_SECRET_KEY", SECRET_KEY)
SECRET_KEY_FALLBACKS = [
    key for key in os.environ.get("ROUND4_SECRET_KEY_FALLBACKS", "").split(",") if key
]

IDEMPOTENCY: dict[str, object] = {
    "ENCRYPTION_KEY": os.environ["ROUND4_ENCRYPTION_KEY"],
    "REQUEST_ID_HEADER": "X-Request-Id",
}
if os.environ.get("ROUND4_REDIS_URL"):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["ROUND4_REDIS_URL"],
        },
    }
    IDEMPOTENCY |= {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}

LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING = {
    "version": 1,
    "handlers": {"file": {"class": "logging.FileHandler", "filename": os.environ["ROUND4_LOG"]}},
    "formatters": {"level": {"format": "%(levelname)s %(message)s"}},
    "loggers": {"idempotency_django": {"handlers": ["file"], "level": "DEBUG"}},
}
LOGGING["handlers"]["file"]["formatter"] = "level"  # type: ignore[index]
