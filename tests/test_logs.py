"""No secret reaches a log line at default settings: the library's, Django's or the server's.

The end-to-end test starts a real server (runserver, gunicorn) on the test
project with every logger at DEBUG into one file (tests/logs_settings.py),
drives each decision of both contracts with secrets in every place a client
puts them, and searches the file and the server's output for them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from django.utils.crypto import get_random_string
from django.views import View
from rest_framework import viewsets
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency_django.webhooks import deduplicate_webhook
from idempotency_django.webhooks.receivers import RedactTriggerURLs
from tests.servers import free_port, stop

ROOT = Path(__file__).resolve().parent.parent
#: Django's loggers whose records carry a request's URL.
URL_LOGGERS = ("django.request", "django.security.csrf", "django.server")


def marker(name: str) -> str:
    return f"{name}-{secrets.token_hex(8)}"


# -- the filter, installed by the app ----------------------------------------------


def redacting(name: str) -> list[logging.Filter]:
    return [f for f in logging.getLogger(name).filters if isinstance(f, RedactTriggerURLs)]


def test_the_app_installs_the_filter_once() -> None:
    for name in URL_LOGGERS:
        assert len(redacting(name)) == 1, name
    apps.get_app_config("idempotency_django").ready()  # as a test may run it again
    for name in URL_LOGGERS:
        assert len(redacting(name)) == 1, name


def test_a_later_dict_config_keeps_the_filter() -> None:
    """dictConfig keeps loggers' filters, even of loggers it names or disables."""
    request_logger = logging.getLogger("django.request")
    saved = (request_logger.disabled, request_logger.propagate, request_logger.level)
    try:
        logging.config.dictConfig(
            {
                "version": 1,
                "disable_existing_loggers": True,
                "loggers": {"django.request": {"level": "WARNING", "propagate": False}},
            }
        )
        for name in URL_LOGGERS:
            assert len(redacting(name)) == 1, name
    finally:
        for name in logging.root.manager.loggerDict:
            logging.getLogger(name).disabled = False
        request_logger.disabled, request_logger.propagate = saved[:2]
        request_logger.setLevel(saved[2])


def test_logging_names_the_filter_by_its_documented_path() -> None:
    """docs/webhooks.md names it ``idempotency_django.webhooks.RedactTriggerURLs`` for LOGGING."""
    configurator = logging.config.DictConfigurator({})
    made = configurator.configure_filter({"()": "idempotency_django.webhooks.RedactTriggerURLs"})
    assert isinstance(made, RedactTriggerURLs)
    record = server_record("POST /hooks/tok-1/ HTTP/1.1")
    assert made.filter(record)
    assert record.args == ("POST hooks/<str:token>/ HTTP/1.1", "400", "12")


def server_record(request_line: str, status: str = "400") -> logging.LogRecord:
    """A record as runserver's ``WSGIRequestHandler.log_message`` makes it."""
    record = logging.LogRecord("django.server", logging.WARNING, "", 0, '"%s" %s %s', None, None)
    record.args = (request_line, status, "12")
    return record


@pytest.mark.parametrize(
    ("request_line", "logged"),
    [
        ("POST /hooks/tok-1/ HTTP/1.1", "POST hooks/<str:token>/ HTTP/1.1"),
        ("POST /hooks/tok-1/?fail=400 HTTP/1.1", "POST hooks/<str:token>/ HTTP/1.1"),
        ("POST /hooks/tok-1 HTTP/1.1", "POST hooks/<str:token>/ HTTP/1.1"),  # APPEND_SLASH
        ("POST /hooks/t%C3%B6k/ HTTP/1.1", "POST hooks/<str:token>/ HTTP/1.1"),
        ("POST http://h/api/hooks/tok-1/ HTTP/1.1", "POST api/hooks/<str:token>/ HTTP/1.1"),
        ("POST /hooks/async/tok-1/ HTTP/1.1", "POST hooks/async/<str:token>/ HTTP/1.1"),
        ("POST /plain/bookings/?x=1 HTTP/1.1", "POST /plain/bookings/?x=1 HTTP/1.1"),
        ("POST /nowhere/ HTTP/1.1", "POST /nowhere/ HTTP/1.1"),
        ("\x16\x03\x01garbage", "\x16\x03\x01garbage"),
    ],
)
def test_runservers_request_line_of_a_receiver_shows_its_route(
    request_line: str, logged: str
) -> None:
    record = server_record(request_line)
    assert RedactTriggerURLs().filter(record)
    assert record.args == (logged, "400", "12")


@pytest.mark.django_db
def test_djangos_request_and_csrf_lines_show_a_receivers_route(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = marker("trigger")
    odd_token = "t\u00f6k\\" + token  # Django's log lines escape non-ASCII and backslashes
    csrf_client = Client(enforce_csrf_checks=True)
    with caplog.at_level(logging.DEBUG):
        csrf_client.post(f"/hooks/{token}/", "{}", content_type="application/json")
        Client().post(
            f"/api/hooks/{token}/", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=","
        )
        Client().post(
            f"/hooks/{token}/?fail=404", "{}", content_type="application/json", HTTP_WEBHOOK_ID="m"
        )
        Client().post(
            f"/hooks/{odd_token}/?fail=400", "{}", "application/json", HTTP_WEBHOOK_ID="m"
        )
        Client().post("/plain/bookings/?status=400", "{}", content_type="application/json")
    messages = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("django")]
    assert messages == [
        ("django.security.csrf", "Forbidden (CSRF cookie not set.): hooks/<str:token>/"),
        ("django.request", "Bad Request: api/hooks/<str:token>/"),
        ("django.request", "Not Found: hooks/<str:token>/"),
        ("django.request", "Bad Request: hooks/<str:token>/"),
        ("django.request", "Bad Request: /plain/bookings/"),  # other views keep their path
    ]
    assert token not in caplog.text


# Receivers as class views: the mark is on a handler, not on the view ``as_view()`` makes.


class ReceiverView(View):
    @deduplicate_webhook
    def post(self, request: HttpRequest, token: str) -> HttpResponse:
        return JsonResponse({"status": "accepted"}, status=202)


class ReceiverAPIView(APIView):
    @deduplicate_webhook
    def post(self, request: Request, token: str) -> Response:
        return Response({"status": "accepted"}, status=202)


class ReceiverViewSet(viewsets.ViewSet):
    @deduplicate_webhook
    def create(self, request: Request, token: str) -> Response:
        return Response({"status": "accepted"}, status=202)


class OtherView(View):
    def post(self, request: HttpRequest, token: str) -> HttpResponse:
        return HttpResponse(status=204)


urlpatterns = [
    path("cbv/<str:token>/", ReceiverView.as_view()),
    path("apiview/<str:token>/", ReceiverAPIView.as_view()),
    path("viewset/<str:token>/", ReceiverViewSet.as_view({"post": "create"})),
    path("other/<str:token>/", OtherView.as_view()),
]


@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/cbv/tok-1/", "cbv/<str:token>/"),
        ("/apiview/tok-1/", "apiview/<str:token>/"),
        ("/viewset/tok-1/", "viewset/<str:token>/"),
        ("/other/tok-1/", "/other/tok-1/"),
    ],
)
def test_a_class_views_receiver_handler_is_recognized(path: str, logged: str) -> None:
    record = server_record(f"POST {path} HTTP/1.1")
    assert RedactTriggerURLs().filter(record)
    assert record.args == (f"POST {logged} HTTP/1.1", "400", "12")


# -- end to end: a real server, every logger at DEBUG -------------------------------


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 301 is an answer to look at, not to follow


@dataclass
class Traffic:
    base: str
    #: Sent with every request: a client-supplied X-Request-Id.
    common: dict[str, str]
    #: Where ``together`` keeps its gates.
    directory: Path
    sent: int = 0
    opener: urllib.request.OpenerDirector = field(
        default_factory=lambda: urllib.request.build_opener(NoRedirects)
    )

    def post(self, path: str, body: str = "{}", **headers: str) -> int:
        self.sent += 1
        request = urllib.request.Request(
            self.base + path,
            data=body.encode(),
            method="POST",
            headers={"Content-Type": "application/json", **self.common, **headers},
        )
        try:
            with self.opener.open(request, timeout=30) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as error:
            error.read()
            return int(error.code)

    def together(self, path: str, body: str = "{}", **headers: str) -> list[int]:
        """Two identical requests at once: the one that claims the key waits in the view
        at a gate (X-Gate, a file) until the other is answered."""
        gate = self.directory / f"gate-{self.sent}"
        gated = {**headers, "X-Gate": str(gate)}
        with ThreadPoolExecutor(max_workers=2) as pool:
            sent = [pool.submit(self.post, path, body, **gated) for _ in range(2)]
            wait(sent, timeout=30, return_when=FIRST_COMPLETED)
            gate.touch()
            return sorted(answer.result() for answer in sent)


@contextlib.contextmanager
def logging_server(kind: str, directory: Path) -> Iterator[str]:
    """The test project under ``kind`` with tests/logs_settings.py; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.logs_settings",
        "TESTS_DB_NAME": str(connection.settings_dict["NAME"]),
        "TESTS_LOG_FILE": str(directory / "all.log"),
        "PYTHONUNBUFFERED": "1",
    }
    if kind == "gunicorn":
        app = "django.core.wsgi:get_wsgi_application()"
        command = ["-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--threads", "4", app]
    else:
        command = ["-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"]
    with (directory / "output.log").open("w") as output:
        process = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env=env, stdout=output, stderr=output
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{kind} did not start:\n" + (directory / "output.log").read_text()
                        ) from None
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process)


@pytest.mark.services
@pytest.mark.parametrize("kind", ["runserver", "gunicorn"])
def test_no_secret_in_any_log_line_of_a_real_server(
    kind: str, transactional_db: None, tmp_path: Path
) -> None:
    found = {
        "password": marker("password"),
        "wrong password": marker("wrong"),
        "body": marker("body"),
        "trigger token": marker("trigger"),
        "delivery id": marker("delivery"),
        "X-Request-Id": marker("request-id"),
        "CSRF cookie": get_random_string(32),
        **{f"key {name}": marker(f"key-{name}") for name in ("first", "busy", "failed")},
        **{f"key {name}": marker(f"key-{name}") for name in ("raised", "basic", "token")},
        **{f"key {name}": marker(f"key-{name}") for name in ("invalid", "delivery")},
    }
    alice = User.objects.create_user("alice", password=found["password"])
    found["API token"] = Token.objects.create(user=alice).key
    session = SessionStore()
    session.update(
        {
            "_auth_user_id": str(alice.pk),
            "_auth_user_backend": "django.contrib.auth.backends.ModelBackend",
            "_auth_user_hash": alice.get_session_auth_hash(),
        }
    )
    session.create()
    found["session cookie"] = str(session.session_key)
    csrf = {"Cookie": f"csrftoken={found['CSRF cookie']}", "X-CSRFToken": found["CSRF cookie"]}
    logged_in = {**csrf, "Cookie": f"sessionid={session.session_key}; {csrf['Cookie']}"}

    def basic(password: str) -> str:
        return "Basic " + b64encode(f"alice:{password}".encode()).decode()

    def key(name: str) -> dict[str, str]:
        return {"Idempotency-Key": found[f"key {name}"]}

    body = json.dumps({"slot": "2027-01-01T09:00:00Z", "customer": found["body"]})
    other_body = json.dumps({"slot": "2027-01-01T10:00:00Z", "customer": found["body"]})
    hook, delivery = f"/hooks/{found['trigger token']}/", found["delivery id"]

    with logging_server(kind, tmp_path) as base:
        traffic = Traffic(base, {"X-Request-Id": found["X-Request-Id"]}, tmp_path)
        post, together = traffic.post, traffic.together
        statuses = {
            # The key contract, through the middleware, with a session.
            "first": post("/plain/bookings/", body, **logged_in, **key("first")),
            "replay": post("/plain/bookings/", body, **logged_in, **key("first")),
            "reused": post("/plain/bookings/", other_body, **logged_in, **key("first")),
            "in progress": together("/plain/bookings/", body, **logged_in, **key("busy")),
            "invalid": post(
                "/plain/bookings/",
                body,
                **logged_in,
                **{"Idempotency-Key": f"{found['key invalid']},"},
            ),
            "missing": post("/plain/required/", body, **logged_in),
            "view failed": post("/plain/bookings/?status=500", body, **logged_in, **key("failed")),
            "view raised": post("/plain/bookings/?raise=1", body, **logged_in, **key("raised")),
            # On DRF, with credentials in the Authorization header.
            "basic": post(
                "/api/bookings/", body, Authorization=basic(found["password"]), **key("basic")
            ),
            "wrong password": post(
                "/api/bookings/", body, Authorization=basic(found["wrong password"]), **key("basic")
            ),
            "token": post(
                "/api/bookings/", body, Authorization=f"Token {found['API token']}", **key("token")
            ),
            # Webhook deliveries: the trigger token is in the URL.
            "no CSRF token": post(hook, body, **{"webhook-id": delivery}),
            "accepted": post(hook, body, **csrf, **{"webhook-id": delivery}),
            "duplicate": post(hook, body, **csrf, **{"webhook-id": delivery}),
            "delivery failed": post(
                hook + "?fail=400", body, **csrf, **{"webhook-id": delivery + "-2"}
            ),
            "delivery failed 500": post(
                hook + "?fail=500", body, **csrf, **{"webhook-id": delivery + "-3"}
            ),
            "delivery raised": post(
                hook + "?raise=1", body, **csrf, **{"webhook-id": delivery + "-4"}
            ),
            "delivery in progress": together(hook, body, **csrf, **{"webhook-id": delivery + "-5"}),
            "delivery invalid key": post(
                hook, body, **csrf, **{"Idempotency-Key": f"{found['key delivery']},"}
            ),
            "no trailing slash": post(hook.rstrip("/"), body, **csrf),
            "DRF receiver": post(
                f"/api/hooks/{found['trigger token']}/", body, **{"svix-id": delivery + "-6"}
            ),
            "DRF duplicate": post(
                f"/api/hooks/{found['trigger token']}/", body, **{"svix-id": delivery + "-6"}
            ),
            "async receiver": post(
                f"/hooks/async/{found['trigger token']}/",
                body,
                **csrf,
                **{"webhook-id": delivery + "-7"},
            ),
            "nowhere": post("/log-sentinel/"),
        }
        if kind == "runserver":
            # runserver writes its request line after the response: wait for the last.
            deadline = time.monotonic() + 10
            while (tmp_path / "all.log").read_text().count(" django.server ") < traffic.sent:
                assert time.monotonic() < deadline, "runserver did not log every request"
                time.sleep(0.05)

    assert statuses == {
        "first": 201,
        "replay": 201,
        "reused": 409,
        "in progress": [201, 409],
        "invalid": 400,
        "missing": 400,
        "view failed": 500,
        "view raised": 500,
        "basic": 201,
        "wrong password": 403,
        "token": 201,
        "no CSRF token": 403,
        "accepted": 202,
        "duplicate": 202,
        "delivery failed": 400,
        "delivery failed 500": 500,
        "delivery raised": 500,
        "delivery in progress": [202, 409],
        "delivery invalid key": 400,
        "no trailing slash": 301,
        "DRF receiver": 202,
        "DRF duplicate": 202,
        "async receiver": 202,
        "nowhere": 404,
    }
    logged = (tmp_path / "all.log").read_text()
    output = (tmp_path / "output.log").read_text()
    leaks = [name for name, value in found.items() if value in logged or value in output]
    assert leaks == [], f"{leaks} in the logs:\n{logged}\n{output}"
    # The file holds what it should, so an empty or broken one cannot pass.
    lines = logged.splitlines()
    for expected in (
        "DEBUG idempotency_django idempotency event=reserved",
        "INFO idempotency_django idempotency event=stored",
        "INFO idempotency_django idempotency event=replayed",
        "INFO idempotency_django.webhooks webhook event=duplicate",
        "WARNING django.request Bad Request: hooks/<str:token>/",
        "ERROR django.request Internal Server Error: hooks/<str:token>/",
        "ERROR django.request Internal Server Error: /plain/bookings/",
        "WARNING django.security.csrf Forbidden (CSRF cookie not set.): hooks/<str:token>/",
        "WARNING django.request Not Found: /log-sentinel/",
    ):
        assert any(line.startswith(expected) for line in lines), expected
    if kind == "runserver":
        assert 'INFO django.server "POST hooks/<str:token>/ HTTP/1.1" 202' in logged
        assert 'INFO django.server "POST hooks/<str:token>/ HTTP/1.1" 301' in logged


def test_operating_md_lists_every_decision_event_at_its_level() -> None:
    """docs/operating.md's table of events and levels is the one the code logs."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    protocol = ("phases.py", "attempt.py", "reservation.py", "waiting.py")
    source = "".join(
        (root / "idempotency_django" / "protocol" / name).read_text() for name in protocol
    )
    logged = set(re.findall(r"logging\.(DEBUG|INFO|WARNING|ERROR),\s*\"(\w+)\"", source))
    page = (root / "docs" / "operating.md").read_text()
    documented = {
        (level, event)
        for level, events in re.findall(r"^\| `(DEBUG|INFO|WARNING|ERROR)` \| (.+) \|$", page, re.M)
        for event in re.findall(r"`(\w+)`", events)
    }
    assert logged and documented == logged
