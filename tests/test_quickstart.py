"""The README's quickstart works as pasted.

Its Python blocks are the sections of tests/docs_examples/quickstart_*.py (the README
cannot include files, so they are compared here); the settings lines are appended to
a fresh ``django-admin startproject`` that then passes ``check`` and ``migrate``; the
viewset is served and a retried POST is replayed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from idempotency_django.conf import DEFAULTS
from tests.docs_examples import quickstart_settings, quickstart_views
from tests.testapp.models import Booking

REPO_ROOT = Path(__file__).resolve().parent.parent
README = (REPO_ROOT / "README.md").read_text()

router = SimpleRouter()
router.register("bookings", quickstart_views.BookingViewSet, basename="quickstart-booking")
urlpatterns = [path("api/", include(router.urls))]


def section(module: object, name: str) -> str:
    text = Path(module.__file__).read_text()  # type: ignore[attr-defined]
    match = re.search(rf"# --8<-- \[start:{name}\]\n(.*?)# --8<-- \[end:{name}\]", text, re.S)
    assert match, f"no section {name}"
    return match[1].strip()


def readme_python_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)]


def test_the_readme_shows_the_tested_files() -> None:
    assert readme_python_blocks() == [
        section(quickstart_settings, "settings"),
        section(quickstart_views, "views"),
    ]


def test_the_readme_installs_the_published_names() -> None:
    installs = re.findall(r"^pip install (.+)$", README, re.M)
    assert any(re.fullmatch(r'"idempotency-django\[drf\] @ git\+https://\S+"', i) for i in installs)
    assert "-e '.[drf]'" in README
    demo = re.findall(r"^```console\n(.*?)^```", README, re.M | re.S)
    assert "pip install -e '.[example]'\npython example_project/manage.py demo\n" in demo


def test_the_optional_settings_are_the_defaults() -> None:
    assert quickstart_settings.IDEMPOTENCY.items() <= DEFAULTS.items()


def test_the_settings_lines_work_in_a_fresh_project(tmp_path: Path) -> None:
    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    run("-m", "django", "startproject", "mysite", ".")
    settings = tmp_path / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + section(quickstart_settings, "settings"))
    assert "no issues" in run("manage.py", "check", "--fail-level", "WARNING")
    run("manage.py", "migrate", "--noinput", "-v", "0")
    assert "[X] 0001_initial" in run("manage.py", "showmigrations", "idempotency_django")


@pytest.mark.urls(__name__)
def test_the_viewset_replays_a_retry(alice: User) -> None:
    client = Client()
    client.force_login(alice)
    body = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})
    answers = [
        client.post(
            "/api/bookings/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="q-1"
        )
        for _ in range(2)
    ]
    assert [a.status_code for a in answers] == [201, 201]
    assert answers[1]["Idempotency-Replayed"] == "true"
    assert answers[1].content == answers[0].content
    assert Booking.objects.count() == 1
