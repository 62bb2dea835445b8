"""Django REST framework integration.

DRF authenticates inside the view, so the key is claimed inside the
handler (``create``, ``update``, an ``@action``...), after authentication,
permissions and throttling, and scoped by the principal DRF resolved.
The handler's response is finalized and rendered there, so the bytes that
are stored are the bytes that go out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.http.response import HttpResponseBase
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.views import APIView

from idempotency_django.conf import header, idempotency_settings
from idempotency_django.fingerprint import ready_body
from idempotency_django.marks import EXEMPT_ATTRIBUTE, PROTECTED_ATTRIBUTE
from idempotency_django.phases import ViewOptions, protect, roll_back_open_transactions
from idempotency_django.problems import PROBLEM_ATTRIBUTE

__all__ = ["IdempotencyError", "IdempotentMixin", "protect_drf_call", "protect_view_class"]

ViewClassT = TypeVar("ViewClassT", bound=type)

#: Handlers that can receive an unsafe method.
UNSAFE_HANDLERS = (
    "create",
    "update",
    "partial_update",
    "destroy",
    "post",
    "put",
    "patch",
    "delete",
)


def protect_drf_call(
    request: Request, call_handler: Callable[[], Any], options: ViewOptions
) -> HttpResponseBase:
    view: APIView = request.parser_context["view"]

    def call_and_finalize() -> HttpResponseBase:
        try:
            response = call_handler()
        except Exception as exc:
            # DRF turns APIExceptions into responses; anything else re-raises.
            response = view.handle_exception(exc)
            # DRF rolls back the ATOMIC_REQUESTS transactions of a handled
            # exception; ``atomic=True`` opened one of ours: the same rule.
            roll_back_open_transactions()
        # Finalized here so that the response can be rendered, and stored, now.
        return view.finalize_response(request, response, *view.args, **view.kwargs)

    response = protect(request, call_and_finalize, options)
    problem = getattr(response, PROBLEM_ATTRIBUTE, None)
    if problem is not None and idempotency_settings.DRF_EXCEPTION_HANDLER:
        raise IdempotencyError(*problem)  # for the project's EXCEPTION_HANDLER to render
    return response


class IdempotencyError(APIException):
    """A refusal of the library, for DRF's ``EXCEPTION_HANDLER`` to render.

    Raised instead of answering with a problem response on DRF views when
    ``IDEMPOTENCY["DRF_EXCEPTION_HANDLER"]`` is on. ``detail`` holds every
    member of the problem (``code`` included, the one clients match on),
    ``status_code`` its status and ``wait`` the seconds for ``Retry-After``.
    """

    def __init__(self, members: dict[str, Any], retry_after: int | None = None) -> None:
        super().__init__(code=members["code"])
        # As is, not turned into ErrorDetail strings: the status stays a number.
        self.detail = members
        self.status_code = int(members["status"])
        self.wait = retry_after


class IdempotentMixin:
    """Protect every unsafe handler of a DRF view or viewset.

    Options as class attribute: ``idempotency_options = ViewOptions(required=True)``,
    read when a request comes, so a subclass may set its own. A handler
    decorated with ``@idempotent(...)`` keeps its own options and one
    decorated with ``@idempotency_exempt`` is left alone.
    """

    idempotency_options = ViewOptions()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _unsafe_handler_names(cls):
            handler = getattr(cls, name)
            if not (
                getattr(handler, EXEMPT_ATTRIBUTE, False)
                or getattr(handler, PROTECTED_ATTRIBUTE, False)
            ):
                setattr(cls, name, _protected_handler(handler))

    def initialize_request(self, request: Any, *args: Any, **kwargs: Any) -> Request:
        # The fingerprint needs the raw body: ready it before authentication
        # (SessionAuthentication's CSRF check) or a parser can consume it.
        settings = idempotency_settings
        if request.method in settings.METHODS and header(request, settings.HEADER) is not None:
            ready_body(request)  # a body over the limit is answered 413 when the key is claimed
        return super().initialize_request(request, *args, **kwargs)  # type: ignore[misc,no-any-return]


def protect_view_class(view_class: ViewClassT, options: ViewOptions) -> ViewClassT:
    """A subclass of ``view_class`` protected by :class:`IdempotentMixin` with ``options``."""
    bases = (
        (view_class,) if issubclass(view_class, IdempotentMixin) else (IdempotentMixin, view_class)
    )
    return type(  # type: ignore[return-value]
        view_class.__name__,
        bases,
        {
            "__module__": view_class.__module__,
            "__qualname__": view_class.__qualname__,
            "__doc__": view_class.__doc__,
            "idempotency_options": options,
        },
    )


def _protected_handler(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def protected(self: IdempotentMixin, request: Request, *args: Any, **kwargs: Any) -> Any:
        return protect_drf_call(
            request, lambda: handler(self, request, *args, **kwargs), self.idempotency_options
        )

    setattr(protected, PROTECTED_ATTRIBUTE, True)
    return protected


def _unsafe_handler_names(view_class: type) -> set[str]:
    names = {name for name in UNSAFE_HANDLERS if callable(getattr(view_class, name, None))}
    get_extra_actions = getattr(view_class, "get_extra_actions", None)
    if get_extra_actions is not None:
        for action in get_extra_actions():
            # An @action maps each HTTP method to a method name; the extra
            # ones come from @my_action.mapping.post and the like.
            names.update(action.mapping.values())
    return names
