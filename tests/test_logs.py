"""No secret reaches a log line at default settings: the library's, Django's or the server's."""

from __future__ import annotations

import logging
import logging.config
import secrets

import pytest
from django.apps import apps
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from django.views import View
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency_django.webhooks import RedactTriggerURLs, deduplicate_webhook

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
        Client().post(f"/hooks/{token}/?fail=404", "{}", content_type="application/json")
        Client().post(f"/hooks/{odd_token}/?fail=400", "{}", content_type="application/json")
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
