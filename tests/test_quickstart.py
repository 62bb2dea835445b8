"""The README's quickstart works as pasted.

Its settings block is appended to a fresh ``django-admin startproject`` that then passes
``check`` and ``migrate``; its viewset is served (on the test app's Booking, on every
database) and a retried POST is replayed; docs/quickstart.md's walkthrough is pasted
into an empty directory, and Sybil runs the docs' blocks in the project it builds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from idempotency_django.conf import DEFAULTS
from tests import servers as servers_module
from tests.docs_blocks import page_code, run_page_code
from tests.docs_examples.drf_views import BookingSerializer
from tests.testapp.models import Booking

REPO_ROOT = Path(__file__).resolve().parent.parent
README = (REPO_ROOT / "README.md").read_text()


def readme_viewset() -> type:
    """README.md's viewset; the Booking and BookingSerializer its app imports are the
    test app's here."""
    source = page_code("README.md", 1)
    for line in ("from .models import Booking\n", "from .serializers import BookingSerializer\n"):
        assert line in source, line
        source = source.replace(line, "")
    namespace: dict[str, object] = {"Booking": Booking, "BookingSerializer": BookingSerializer}
    exec(compile(source, str(REPO_ROOT / "README.md"), "exec"), namespace)
    viewset = namespace["BookingViewSet"]
    assert isinstance(viewset, type)
    return viewset


router = SimpleRouter()
router.register("bookings", readme_viewset(), basename="quickstart-booking")
urlpatterns = [path("api/", include(router.urls))]


def test_the_readme_installs_the_published_names() -> None:
    installs = re.findall(r"^pip install (.+)$", README, re.M)
    assert any(re.fullmatch(r'"idempotency-django\[drf\] @ git\+https://\S+"', i) for i in installs)
    assert "-e '.[drf]'" in README
    demo = re.findall(r"^```console\n(.*?)^```", README, re.M | re.S)
    assert "pip install -e '.[example]'\npython example_project/manage.py demo\n" in demo


def test_the_optional_settings_are_the_defaults() -> None:
    readme = run_page_code("README.md", {"INSTALLED_APPS": [], "MIDDLEWARE": []}, 0)
    assert readme["IDEMPOTENCY"].items() <= DEFAULTS.items()


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
    settings.write_text(settings.read_text() + "\n" + page_code("README.md", 0))
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


# -- docs/quickstart.md: a fresh project from its blocks, and its curl walkthrough -------

QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```', re.M | re.S)


def walkthrough() -> list[tuple[str, str]]:
    """("file", path) and its text, or ("command", line), for every block of the
    quickstart's walkthrough in page order."""
    page = QUICKSTART.read_text()
    match = re.search(r"<!-- walkthrough: start -->(.*)<!-- walkthrough: end -->", page, re.S)
    assert match, "docs/quickstart.md has no walkthrough markers"
    steps: list[tuple[str, str]] = []
    for lang, title, body in BLOCK.findall(match[1]):
        if lang == "python":
            assert title, "a python block of the walkthrough names its file (title=...)"
            steps.append((title, body))
        else:
            assert lang == "console", lang
            for line in body.replace("\\\n", " ").splitlines():
                steps.append(("command", " ".join(line.split())))
    return steps


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_quickstart_pasted_into_a_fresh_project(tmp_path: Path) -> None:
    """Every block of docs/quickstart.md's walkthrough, pasted in order into an empty
    directory; the server it starts is real (runserver), and so is curl."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    port = servers_module.free_port()
    replies: list[str] = []
    server = None

    def run(command: str) -> str:
        done = subprocess.run(
            ["bash", "-c", command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        return done.stdout

    steps = walkthrough()
    assert next(s for s in steps if s[0] == "command")[1].startswith("django-admin startproject")
    try:
        for kind, text in steps:
            if kind != "command":
                target = tmp_path / kind
                mode = "a" if target.name == "settings.py" else "w"
                with target.open(mode) as file:
                    file.write("\n" + text if mode == "a" else text)
            elif text.endswith("manage.py runserver"):
                log = (tmp_path / "server.log").open("w")
                server = subprocess.Popen(
                    [*shlex.split(text), "--noreload", f"127.0.0.1:{port}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                servers_module.wait_until(
                    lambda: servers_module.status(f"http://127.0.0.1:{port}/api/") is not None,
                    server,
                    what="runserver",
                    log=tmp_path / "server.log",
                )
            elif text.startswith("curl"):
                # The page sends its first request twice ("exactly the same request again").
                replies += [run(text) for _ in range(1 if replies else 2)]
            else:
                run(text)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)

    docs_blocks(tmp_path, env)
    first, again, changed, listing = replies
    assert first.startswith("HTTP/1.1 201") and "Idempotency-Replayed" not in first, first
    assert again.startswith("HTTP/1.1 201") and "Idempotency-Replayed: true" in again, again
    assert first.split("\n\n", 1)[1] == again.split("\n\n", 1)[1]
    assert changed.startswith("HTTP/1.1 409") and "idempotency_key_reused" in changed, changed
    bookings = json.loads(listing)
    assert [b["customer"] for b in bookings] == ["Dana Whitfield"], bookings
    # The page's LOGGING turned the decision lines on, as docs/operating.md shows them.
    out = (tmp_path / "server.log").read_text()
    events = re.findall(r"^idempotency event=(\w+) method=POST route=api/bookings/\$? ", out, re.M)
    assert events == ["stored", "replayed", "conflict"], out  # one line per request
    assert re.search(r"event=conflict .*key_digest=[0-9a-f]{16} .*code=idempotency_key_reused", out)


def docs_blocks(project: Path, env: dict[str, str]) -> None:
    """Sybil runs the docs' Python blocks from the Markdown in the project the
    walkthrough built (tests/docs_blocks.py says how each kind of block runs)."""
    from tests import docs_blocks as plugin

    (project / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-p", "tests.docs_blocks", "-c", "pytest.ini", "--ds", "mysite.settings"),
            *(str(REPO_ROOT / page) for page in plugin.PAGES),
        ],
        cwd=project,
        env={**env, "PYTHONPATH": os.pathsep.join([str(project), str(REPO_ROOT)])},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert re.search(r"\b\d+ passed", done.stdout), done.stdout
