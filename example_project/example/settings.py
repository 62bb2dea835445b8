"""Settings for the example project, driven by environment variables.

``DATABASE_URL``              database (default: SQLite file example_project/db.sqlite3)
``REDIS_URL``                 a django-redis cache as "default" (default: local memory)
``EXAMPLE_IDEMPOTENCY_BACKEND`` "db" (default) or "redis" (needs REDIS_URL)
``EXAMPLE_BOOKING_DELAY_MS``  creating a booking sleeps that long (to see 409 in progress)
``EXAMPLE_BOOKING_GATE``      a file path: creating a booking first waits until the file
                              exists (at most 60 s). The tests open this gate once a
                              duplicate has been answered, where a delay could run out
                              first on a loaded machine
``EXAMPLE_PAUSE_AFTER_WRITE``  a file path: while the file exists, a request waits right
                              after its booking's INSERT (the reliability suite kills a
                              worker there)
``EXAMPLE_LOCK_TIMEOUT_S``    IDEMPOTENCY["LOCK_TIMEOUT"] (default 300)
``EXAMPLE_RETENTION_S``       IDEMPOTENCY["RETENTION"] (default 86400)
``EXAMPLE_HEARTBEAT_S``       IDEMPOTENCY["HEARTBEAT"], seconds, may be a fraction (default off)
``EXAMPLE_ATOMIC_REQUESTS``   "1": ATOMIC_REQUESTS on the default database (default off)
``EXAMPLE_ASYNC_CLAIM_COMMIT`` "1": the database store's async_claim_commit (default off)
``EXAMPLE_SQLITE_TIMEOUT_S``  on SQLite, seconds a statement waits for the write lock
                              (default 20; a small one provokes "database is locked")
``EXAMPLE_DEBUG``             "0" turns DEBUG off (default on: a local demo)
``EXAMPLE_SECRET_KEY``, ``EXAMPLE_ALLOWED_HOSTS`` (comma-separated, added to the local ones)
``EXAMPLE_WEBHOOK_SECRET``    the Standard Webhooks receiver's ``whsec_`` secret (a demo one)
"""

import importlib.util
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


DEBUG = env_flag("EXAMPLE_DEBUG", True)
SECRET_KEY = os.environ.get(
    "EXAMPLE_SECRET_KEY", "django-insecure-example-project-only-do-not-deploy-3f9c2a71b6"
)
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"] + [
    host.strip() for host in os.environ.get("EXAMPLE_ALLOWED_HOSTS", "").split(",") if host.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "idempotency_django",
    "bookings",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # After AuthenticationMiddleware: keys are scoped by request.user.
    "idempotency_django.middleware.IdempotencyMiddleware",
]

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # runserver is threaded: let a writer wait for another instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = float(
        os.environ.get("EXAMPLE_SQLITE_TIMEOUT_S", "").strip() or 20
    )
DATABASES["default"]["ATOMIC_REQUESTS"] = env_flag("EXAMPLE_ATOMIC_REQUESTS", False)

REDIS_URL = os.environ.get("REDIS_URL", "").strip()
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

IDEMPOTENCY = {
    "STORE": "database",
    "LOCK_TIMEOUT": env_int("EXAMPLE_LOCK_TIMEOUT_S", 300),  # 5 minutes
    "RETENTION": env_int("EXAMPLE_RETENTION_S", 86400),  # 24 hours
}

BACKEND = os.environ.get("EXAMPLE_IDEMPOTENCY_BACKEND", "db").strip().lower() or "db"
if BACKEND == "redis":
    if not REDIS_URL:
        raise ImproperlyConfigured("EXAMPLE_IDEMPOTENCY_BACKEND=redis needs REDIS_URL.")
    IDEMPOTENCY["STORE"] = "redis"
    IDEMPOTENCY["STORE_OPTIONS"] = {"cache": "default"}
elif BACKEND == "db":
    if env_flag("EXAMPLE_ASYNC_CLAIM_COMMIT", False):
        IDEMPOTENCY["STORE_OPTIONS"] = {"async_claim_commit": True}
else:
    raise ImproperlyConfigured(f"EXAMPLE_IDEMPOTENCY_BACKEND must be db or redis, not {BACKEND!r}.")

#: Seconds a duplicate waits for the request it duplicates (WAIT_FOR_IN_PROGRESS).
IDEMPOTENCY["WAIT_FOR_IN_PROGRESS"] = env_int("EXAMPLE_WAIT_FOR_IN_PROGRESS_S", 0)
if os.environ.get("EXAMPLE_HEARTBEAT_S"):
    IDEMPOTENCY["HEARTBEAT"] = float(os.environ["EXAMPLE_HEARTBEAT_S"])
#: Live keys one principal may hold (MAX_KEYS_PER_PRINCIPAL); 0 means no limit.
if "EXAMPLE_MAX_KEYS_PER_PRINCIPAL" in os.environ:
    IDEMPOTENCY["MAX_KEYS_PER_PRINCIPAL"] = env_int("EXAMPLE_MAX_KEYS_PER_PRINCIPAL", 0) or None

#: Milliseconds creating a booking takes (simulated work), to see "409 in progress".
EXAMPLE_BOOKING_DELAY_MS = env_int("EXAMPLE_BOOKING_DELAY_MS", 0)
#: A file path: creating a booking waits until that file exists (at most 60 s, then it
#: goes on), so that a test decides when the work ends: after the duplicate it sends
#: meanwhile has been answered 409 in progress, however slow the machine.
EXAMPLE_BOOKING_GATE = os.environ.get("EXAMPLE_BOOKING_GATE", "")
#: A file path: while that file exists, a request waits right after a booking's INSERT,
#: before the rest of the request (its stored response, its commit). The reliability
#: suite kills a worker there.
EXAMPLE_PAUSE_AFTER_WRITE = os.environ.get("EXAMPLE_PAUSE_AFTER_WRITE", "")
#: The secret /standard-hooks/<token>/ verifies signatures with (base64 after whsec_), as
#: a Standard Webhooks sender shows it. The default is for the demo only.
EXAMPLE_WEBHOOK_SECRET = os.environ.get(
    "EXAMPLE_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Basic first, so a bad or missing credential is 401 + WWW-Authenticate
        # (a client exchanges its credential once) rather than 403.
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",  # with CSRF
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

# The OpenAPI schema at /api/schema/, when drf-spectacular is installed: protected
# endpoints document Idempotency-Key, Idempotency-Replayed and the problem responses.
if importlib.util.find_spec("drf_spectacular") is not None:
    INSTALLED_APPS.append("drf_spectacular")
    REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "idempotency_django.openapi.IdempotentAutoSchema"

LOGIN_URL = "/admin/login/"
LOGIN_REDIRECT_URL = "/"

AUTH_PASSWORD_VALIDATORS = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The app itself keeps webhook trigger tokens out of Django's log lines.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # INFO: one line per keyed request; DEBUG adds each reservation as it is made.
    "loggers": {
        "idempotency_django": {
            "handlers": ["console"],
            "level": os.environ.get("EXAMPLE_LOG_LEVEL", "INFO"),
        }
    },
}
