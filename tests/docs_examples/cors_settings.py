"""django-cors-headers settings for a front end on another origin (docs/cors.md).

tests/test_cors.py applies the section below to the test project and sends a
preflight and a keyed request from that origin. The two lists stand in for yours.
"""

INSTALLED_APPS = ["django.contrib.auth", "idempotency_django"]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "idempotency_django.middleware.IdempotencyMiddleware",
]

# --8<-- [start:cors]
from corsheaders.defaults import default_headers  # noqa: E402

INSTALLED_APPS += ["corsheaders"]
# As high as possible, before any middleware that can answer (CommonMiddleware's redirects).
MIDDLEWARE.insert(0, "corsheaders.middleware.CorsMiddleware")

CORS_ALLOWED_ORIGINS = ["https://app.example.com"]
# The front end may send these two...
CORS_ALLOW_HEADERS = (*default_headers, "idempotency-key", "x-location-id")
# ...and read these two: a replay, and how long to wait on 409 in progress or 503.
CORS_EXPOSE_HEADERS = ["Idempotency-Replayed", "Retry-After"]
# Only if the front end sends cookies (session login): fetch(url, {credentials: "include"}).
CORS_ALLOW_CREDENTIALS = True
# --8<-- [end:cors]
