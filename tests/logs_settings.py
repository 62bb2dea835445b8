"""The test project with every logger at DEBUG into one file, for tests/test_logs.py.

Django's own logging setup runs (``LOGGING_CONFIG`` is set again, unlike in
tests/settings.py), as it would in a project, so the library's filters must
survive it. The file is ``TESTS_LOG_FILE``.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

DEBUG = False
LOGGING_CONFIG = "logging.config.dictConfig"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"everything": {"format": "%(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "file": {
            "class": "logging.FileHandler",
            "filename": os.environ["TESTS_LOG_FILE"],
            "formatter": "everything",
            "level": "DEBUG",
        }
    },
    "root": {"handlers": ["file"], "level": "DEBUG"},
    # Django's defaults send django.server to its own handler only and drop
    # django.* below INFO: here all of them reach the file.
    "loggers": {
        name: {"handlers": [], "level": "DEBUG", "propagate": True}
        for name in (
            "django",
            "django.server",
            "django.request",
            "django.security",
            "idempotency_django",
        )
    },
}
