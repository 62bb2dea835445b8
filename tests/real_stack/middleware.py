"""A project's own middleware, and the middleware lists real projects run."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import SimpleTemplateResponse

from tests.real_stack.views import QueuedForLater

IDEMPOTENCY = "idempotency_django.middleware.IdempotencyMiddleware"
QUEUEING = "tests.real_stack.middleware.QueueingMiddleware"
LOGIN_REQUIRED = "django.contrib.auth.middleware.LoginRequiredMiddleware"
GZIP = "django.middleware.gzip.GZipMiddleware"
LOCALE = "django.middleware.locale.LocaleMiddleware"

#: ``startproject``'s list, with the idempotency middleware appended.
STARTPROJECT = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    IDEMPOTENCY,
]


def with_middleware(middleware: str, *, after: str) -> list[str]:
    """:data:`STARTPROJECT` with ``middleware`` inserted right after ``after``."""
    position = STARTPROJECT.index(after) + 1
    return [*STARTPROJECT[:position], middleware, *STARTPROJECT[position:]]


class QueueingMiddleware:
    """Turns :class:`QueuedForLater` into 202 and tells templates who served them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, QueuedForLater):
            return JsonResponse({"queued": True}, status=202)
        return None

    def process_template_response(
        self, request: HttpRequest, response: SimpleTemplateResponse
    ) -> SimpleTemplateResponse:
        response.context_data = {
            **(response.context_data or {}),
            "served_by": "the queueing middleware",
        }
        response["X-Served-By"] = "queueing-middleware"
        return response
