"""One keyed request and its retry through the installed wheel: a replay, one run."""

import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

import django

django.setup()

import urls  # noqa: E402  # this project's URLconf (and its view's run counter)
from django.contrib.auth.models import User  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

import idempotency_django  # noqa: E402

installed_at = Path(idempotency_django.__file__).resolve()
assert "site-packages" in installed_at.parts, f"not the installed wheel: {installed_at}"
assert importlib.util.find_spec("rest_framework") is None, "DRF must not be installed here"

setup_test_environment()
client = Client()
client.force_login(User.objects.get_or_create(username="dana")[0])
answers = [
    client.post("/book/", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1")
    for _ in range(2)
]
assert [a.status_code for a in answers] == [201, 201], answers
assert answers[1]["Idempotency-Replayed"] == "true"
assert answers[1].content == answers[0].content
assert urls.RUNS["count"] == 1
missing = client.post("/book/", "{}", content_type="application/json")
assert missing.status_code == 400 and missing.json()["code"] == "idempotency_key_missing"
print(f"smoke: replayed by {installed_at.parent}, Django {django.get_version()}", file=sys.stderr)
