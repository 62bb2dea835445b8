"""The test project as the servers of these tests run it; the environment picks the variant.

``HANGUP_ATOMIC=1``: ``ATOMIC_REQUESTS`` on the default database. ``HANGUP_STORE``:
``database`` (default), ``redis``, ``second-database`` (the database store on a second
alias, with ``ATOMIC_REQUESTS`` there too, or ``IDEMPOTENCY["ATOMIC"]`` with
``HANGUP_ATOMIC_SETTING=1``) or ``slow`` (the database store, slow to answer a claim, as
a remote database is). ``HANGUP_LOCK_TIMEOUT``: seconds.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS, MIDDLEWARE

ROOT_URLCONF = "tests.hangup.urls"
INSTALLED_APPS = [*INSTALLED_APPS]
MIDDLEWARE = [
    *MIDDLEWARE[: MIDDLEWARE.index("idempotency_django.middleware.IdempotencyMiddleware") + 1],
    # After the idempotency middleware: it fails on the way out when asked to.
    "tests.hangup.middleware.FailOnTheWayOut",
    *(["tests.hangup.middleware.SyncOnly"] if os.environ.get("HANGUP_SYNC_ONLY") else []),
]
DATABASES["default"]["ATOMIC_REQUESTS"] = os.environ.get("HANGUP_ATOMIC") == "1"

_store = os.environ.get("HANGUP_STORE", "database")
IDEMPOTENCY: dict[str, object] = {
    "LOCK_TIMEOUT": int(os.environ.get("HANGUP_LOCK_TIMEOUT", "300")),
}
if _store == "redis":
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["HANGUP_REDIS_URL"],
        },
    }
    IDEMPOTENCY |= {"STORE": "redis", "STORE_OPTIONS": {"cache": "idempotency"}}
elif _store == "second-database":
    # The records on a database of their own (the same server and database here, through
    # a connection of its own), listed after the work's.
    DATABASES["records"] = {**DATABASES["default"]}
    IDEMPOTENCY |= {"STORE_OPTIONS": {"database": "records"}}
    if os.environ.get("HANGUP_ATOMIC_SETTING") == "1":
        IDEMPOTENCY["ATOMIC"] = True
    else:
        DATABASES["records"]["ATOMIC_REQUESTS"] = True
elif _store == "slow":
    IDEMPOTENCY |= {"STORE": "tests.hangup.stores.SlowClaimStore"}

_HERE = os.path.dirname(__file__)
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [
            os.path.join(_HERE, "templates"),
            os.path.join(os.path.dirname(_HERE), "real_stack", "templates"),
        ],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]

if os.environ.get("HANGUP_LOG"):
    # The library's decision lines, every level, to the file the test reads.
    LOGGING_CONFIG = "logging.config.dictConfig"
    LOGGING = {
        "version": 1,
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": os.environ["HANGUP_LOG"]}
        },
        "formatters": {"level": {"format": "%(levelname)s %(message)s"}},
        "loggers": {"idempotency_django": {"handlers": ["file"], "level": "DEBUG"}},
    }
    LOGGING["handlers"]["file"]["formatter"] = "level"  # type: ignore[index]
