"""Django settings for the overhead benchmark: the example project's, measured as deployed.

Everything comes from ``example.settings`` (the same environment variables:
``DATABASE_URL``, ``REDIS_URL``, ``EXAMPLE_IDEMPOTENCY_BACKEND``...). The
differences, each so the numbers measure the library rather than the demo:

- ``ROOT_URLCONF`` adds the undecorated booking viewset at ``/bare/bookings/``;
- ``DEBUG`` off, persistent database connections (``CONN_MAX_AGE``), as in production;
- a fast password hasher: every request authenticates with HTTP Basic, and
  PBKDF2's ~0.3 s per request would hide everything else (same in every scenario);
- the ``idempotency_django`` logger stays at INFO (its records are built, as in
  production) but goes to a ``NullHandler`` instead of the console.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "example_project"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from example.settings import *  # noqa: E402,F403
from example.settings import DATABASES  # noqa: E402

ROOT_URLCONF = "benchmarks.bench_urls"
DEBUG = False
DATABASES["default"]["CONN_MAX_AGE"] = 600
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        "idempotency_django": {"handlers": ["null"], "level": "INFO", "propagate": False},
        "django.request": {"handlers": ["null"], "level": "ERROR", "propagate": False},
    },
}
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "testserver"]  # noqa: F405  (Django's test Client)

if os.environ.get("BENCH_PG_SYNC_COMMIT_OFF") == "1":  # diagnostic variant: no WAL flush per commit
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"

if os.environ.get("BENCH_MEMORY_STORE") == "1":  # the library's own cost, without store I/O
    IDEMPOTENCY["STORE"] = "benchmarks.memory_store.MemoryStore"  # noqa: F405
