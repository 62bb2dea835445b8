"""Settings of the task workers that tests/test_task_workers.py starts: the test settings,

on the test database (``TESTS_DB_NAME``), with the ``IDEMPOTENCY`` settings the test
passes as JSON in ``TESTS_IDEMPOTENCY`` and the Redis store's cache on ``TESTS_REDIS_URL``.
"""

import json
import os

from tests.settings import *  # noqa: F403

REDIS_URL = os.environ.get("TESTS_REDIS_URL", "redis://127.0.0.1:6379/15")
CACHES = {
    **CACHES,  # noqa: F405
    "idempotency": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
}
IDEMPOTENCY = json.loads(os.environ.get("TESTS_IDEMPOTENCY", "{}"))
# The tasks' decisions in the worker's log, for the test to read.
LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "idempotency_django.tasks": {"handlers": ["stderr"], "level": "DEBUG", "propagate": False}
    },
}
