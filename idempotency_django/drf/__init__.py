"""Django REST framework integration.

DRF authenticates inside the view, so :class:`IdempotentMixin` claims the key after DRF's
``initial`` (authentication, permissions, throttling), scoped by the principal DRF
resolved, and stores the finalized, rendered response in ``finalize_response``.
``@idempotent`` on one handler, or below ``@api_view``, protects that call
(:func:`protect_drf_call`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from django.http.response import HttpResponseBase
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.bodies import READIED_ATTRIBUTE, ready_body
from idempotency_django.protocol.marks import (
    EXEMPT_ATTRIBUTE,
    OPTIONS_ATTRIBUTE,
    key_header,
)
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import Protection, protect, work_interrupted
from idempotency_django.protocol.problems import PROBLEM_ATTRIBUTE
from idempotency_django.protocol.routes import match_of
from idempotency_django.protocol.transactions import transaction_block

__all__ = ["IdempotencyError", "IdempotentMixin", "protect_drf_call"]


class IdempotencyError(APIException):
    """A refusal of the library, for DRF's ``EXCEPTION_HANDLER`` to render.

    Raised instead of answering with a problem response on DRF views whose
    ``raise_idempotency_errors`` is True. ``detail`` holds every
    member of the problem (``code`` included, the one clients match on),
    ``status_code`` its status and ``wait`` the seconds for ``Retry-After``.
    """

    def __init__(self, members: dict[str, Any], retry_after: int | None = None) -> None:
        super().__init__(code=members["code"])
        # As is, not turned into ErrorDetail strings: the status stays a number.
        self.detail = members
        self.status_code = int(members["status"])
        self.wait = retry_after


class Answered(Exception):
    """Phase 1 answered for the key (a replay, a conflict): the handler must not run."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__()
        self.response = response


class IdempotentMixin:
    """Protect every unsafe handler of a DRF view or viewset.

    Options as class attribute: ``idempotency_options = ViewOptions(required=True)``,
    read when a request comes, so a subclass may set its own. With
    ``raise_idempotency_errors = True`` a refusal is raised as
    [`IdempotencyError`][idempotency_django.drf.IdempotencyError] for DRF's
    ``EXCEPTION_HANDLER`` to render, like the view's other errors. A handler
    decorated with ``@idempotent(...)`` keeps its own options and one
    decorated with ``@idempotency_exempt`` is left alone.
    """

    idempotency_options = ViewOptions()
    raise_idempotency_errors = False
    _idempotency_protection: Protection | None = None
    #: marks.PROTECTED_ATTRIBUTE: the middleware leaves this view's keys to it.
    idempotency_protected = True

    def initialize_request(self, request: Any, *args: Any, **kwargs: Any) -> Request:
        # The fingerprint needs the raw body: ready it before authentication (the CSRF
        # check) or a parser can consume it, unless the middleware did. A body over the
        # limit is answered 413 when the key is claimed.
        settings = idempotency_settings
        if (
            request.method in settings.METHODS
            and not getattr(request, READIED_ATTRIBUTE, False)
            and key_header(request, settings.HEADER) is not None
        ):
            ready_body(request, getattr(request, "resolver_match", None) or match_of(request))
        return super().initialize_request(request, *args, **kwargs)  # type: ignore[misc,no-any-return]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        # Read on Django's request: DRF's Request hands an attribute on after a failed lookup.
        method = str(request._request.method)
        if (
            method not in idempotency_settings.METHODS
            or (name := method.lower()) not in self.http_method_names  # type: ignore[attr-defined]
            or (handler := getattr(self, name, None)) is None  # 405: nothing to protect
            or (options := self.idempotency_options_of(handler)) is None
        ):
            return
        protection = Protection(request, options, transaction_block(options))
        answer = protection.enter()
        if answer is not None:
            raise Answered(answer)
        self._idempotency_protection = protection

    def idempotency_options_of(self, handler: Callable[..., Any]) -> ViewOptions | None:
        """A handler's own options (``@idempotent``), None if exempt, else the view's."""
        func = getattr(handler, "__func__", handler)
        if getattr(func, EXEMPT_ATTRIBUTE, False):
            return None
        own = getattr(func, OPTIONS_ATTRIBUTE, None)
        return own if isinstance(own, ViewOptions) else self.idempotency_options

    # DRF's stubs type these two hooks with Response, so that a view may mix this class
    # with APIView under mypy; DRF passes a replay or a refusal through: hence the casts.

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, Answered):
            return cast(Response, exc.response)
        protection = self._idempotency_protection
        try:
            response: Response = super().handle_exception(exc)  # type: ignore[misc]
        except BaseException as error:
            if protection is not None:
                self._idempotency_protection = None
                protection.fail(error)
            raise
        if protection is not None:
            # DRF rolls back the ATOMIC_REQUESTS transactions of a handled
            # exception; ``atomic=True`` opened one of ours: the same rule.
            work_interrupted(self.request, exc)  # type: ignore[attr-defined]
        return response

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        protection, self._idempotency_protection = self._idempotency_protection, None
        try:
            response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        except BaseException as error:
            # DRF refuses what the handler returned (not a response): abort like any
            # exception, and close the transaction enter() opened, or it stays open.
            if protection is not None:
                protection.fail(error)
            raise
        if protection is not None:
            response = cast(Response, protection.exit(response))
        problem = getattr(response, PROBLEM_ATTRIBUTE, None)
        if problem is not None and self.raise_idempotency_errors:
            error_response = rendered_refusal(self, problem, response)  # type: ignore[arg-type]
            response = super().finalize_response(request, error_response, *args, **kwargs)  # type: ignore[misc]
        return response


def rendered_refusal(view: APIView, problem: Any, answer: HttpResponseBase) -> Response:
    """A refusal rendered by the project's ``EXCEPTION_HANDLER``, like the view's other
    errors, still naming the key where ``answer`` did (``MARKER_HEADERS["KEY_ECHO"]``)."""
    response: Response = view.handle_exception(IdempotencyError(*problem))
    echo = idempotency_settings.MARKER_HEADERS.key_echo
    if echo and echo in answer:
        response[echo] = answer[echo]
    return response


def protect_drf_call(
    request: Request, call_handler: Callable[[], Any], options: ViewOptions
) -> HttpResponseBase:
    """Protect one handler call: ``@idempotent`` on a handler, or below ``@api_view``."""
    view: APIView = request.parser_context["view"]
    if isinstance(view, IdempotentMixin):
        return cast(HttpResponseBase, call_handler())  # the mixin's hooks protect it

    def call_and_finalize() -> HttpResponseBase:
        try:
            response = call_handler()
        except Exception as exc:
            # DRF turns APIExceptions into responses; anything else re-raises.
            response = view.handle_exception(exc)
            work_interrupted(request, exc)  # as in IdempotentMixin.handle_exception
        # Finalized here so that the response can be rendered, and stored, now.
        return view.finalize_response(request, response, *view.args, **view.kwargs)

    response = protect(request, call_and_finalize, options)
    problem = getattr(response, PROBLEM_ATTRIBUTE, None)
    if problem is not None and getattr(view, "raise_idempotency_errors", False):
        # Raised out of the protected call (a method its handler calls, whose later
        # writes must not run): the project's EXCEPTION_HANDLER renders it, without
        # the key echo, which no exception carries through DRF's.
        raise IdempotencyError(*problem)
    return response
