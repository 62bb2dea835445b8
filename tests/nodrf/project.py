"""A project without Django REST framework: run as a script by tests/test_without_drf.py."""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.modules["rest_framework"] = None  # type: ignore[assignment]  # "not installed"

import django  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

counter = {"runs": 0}
DATABASE = os.path.join(tempfile.mkdtemp(), "nodrf.sqlite3")


def book(request):  # type: ignore[no-untyped-def]
    counter["runs"] += 1
    return JsonResponse({"run": counter["runs"]}, status=201)


def decorated(request):  # type: ignore[no-untyped-def]
    counter["runs"] += 1
    return JsonResponse({"run": counter["runs"]}, status=201)


urlpatterns = [path("book/", book)]

settings.configure(
    SECRET_KEY="no-drf",
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["*"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DATABASE}},
    INSTALLED_APPS=[
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "idempotency_django",
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempotency_django.middleware.IdempotencyMiddleware",
    ],
    USE_TZ=True,
)
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from idempotency_django import idempotent  # noqa: E402

urlpatterns.append(path("decorated/", idempotent(required=True)(decorated)))

setup_test_environment()
call_command("migrate", verbosity=0)
call_command("check", fail_level="WARNING")
client = Client()
client.force_login(User.objects.create_user("dana"))
answers = []
for url, key in [("/book/", "k1"), ("/book/", "k1"), ("/decorated/", "k2"), ("/decorated/", "k2")]:
    response = client.post(url, "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
    answers.append([response.status_code, response.get("Idempotency-Replayed"), response.json()])
print(
    json.dumps(
        {
            "answers": answers,
            "runs": counter["runs"],
            "drf": "rest_framework" in sys.modules and sys.modules["rest_framework"] is not None,
        }
    )
)
