"""Test settings. ``TEST_DATABASE=postgres`` (or ``mariadb``) runs the suite on that server."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "idempotency_django",
    "tests.testapp",
]
if importlib.util.find_spec("django_tasks_db") is not None:
    # The tasks framework's database backend (tests/test_task_workers.py).
    INSTALLED_APPS.append("django_tasks_db")
    # The framework runs a task at once, in the caller's transaction, on "immediate".
    _framework = "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
    TASKS = {
        "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
        "immediate": {
            "BACKEND": f"{_framework}.backends.immediate.ImmediateBackend",
        },
    }

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "idempotency_django.middleware.IdempotencyMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

TEST_DATABASE = os.environ.get("TEST_DATABASE", "sqlite")
DATABASES: dict[str, dict[str, Any]]
if TEST_DATABASE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            # A server process started by a test points NAME at the test database.
            "NAME": os.environ.get("TESTS_DB_NAME", os.environ.get("PGDATABASE", "test")),
            "TEST": {"NAME": os.environ.get("TESTS_PG_TEST_NAME", "test_idempotency_django")},
        }
    }
elif TEST_DATABASE == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "NAME": os.environ.get("TESTS_DB_NAME", "test"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {
                "NAME": os.environ.get("TESTS_MARIADB_TEST_NAME", "test_idempotency_django"),
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_bin",
            },
        }
    }
elif TEST_DATABASE == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("TESTS_DB_NAME", "idempotency-tests.sqlite3"),
            # A file, not memory, so that threads and server processes share one
            # database; one per test run, so that parallel runs do not collide.
            "TEST": {
                "NAME": os.path.join(
                    tempfile.gettempdir(), f"idempotency-tests-{os.getpid()}.sqlite3"
                )
            },
        }
    }
else:
    raise RuntimeError(f"Unknown TEST_DATABASE={TEST_DATABASE!r}")

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING_CONFIG: str | None = None

# The test project serves django-ninja operations without the integration (W043) and
# one under the Django views' @idempotent (E017) on purpose (tests/test_ignored_key.py
# shows what their callers are told).
SILENCED_SYSTEM_CHECKS = ["idempotency_django.W043", "idempotency_django.E017"]
