"""The quickstart's settings lines (README.md, docs/quickstart.md).

tests/test_quickstart.py appends the sections below to the settings.py of a fresh
``django-admin startproject`` and runs ``manage.py check`` and ``migrate`` there, so
the lines work as pasted. The two lists stand in for startproject's.
"""

INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes"]
MIDDLEWARE = ["django.contrib.auth.middleware.AuthenticationMiddleware"]

# --8<-- [start:settings]
INSTALLED_APPS += ["idempotency_django"]
# After AuthenticationMiddleware (keys are scoped per user); the end of the list is fine.
MIDDLEWARE += ["idempotency_django.middleware.IdempotencyMiddleware"]

# Optional; these are the defaults.
IDEMPOTENCY = {
    "LOCK_TIMEOUT": 300,  # seconds a request may hold its key before a retry takes over
    "RETENTION": 86400,  # seconds a completed response is replayed
}
# --8<-- [end:settings]

# --8<-- [start:drf]
INSTALLED_APPS += ["rest_framework", "bookings"]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication",  # curl -u
        "rest_framework.authentication.SessionAuthentication",  # the browsable API (CSRF)
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}
# --8<-- [end:drf]

# --8<-- [start:logging]
# A library does not configure logging (Django's convention): without these lines its
# decision lines, at INFO, go nowhere.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        # Also idempotency_django.webhooks, its child. The retry client logs on idempotency_client.
        "idempotency_django": {"handlers": ["console"], "level": "INFO"},
    },
}
# --8<-- [end:logging]
