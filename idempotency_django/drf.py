"""Django REST framework integration.

DRF authenticates inside the view, so the key is claimed inside the
handler (``create``, ``update``, an ``@action``...), after authentication,
permissions and throttling, and scoped by the principal DRF resolved.
The handler's response is finalized and rendered there, so the bytes that
are stored are the bytes that go out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.http.response import HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency_django.conf import idempotency_settings
from idempotency_django.decorators import OPTIONS_ATTRIBUTE, protect_callable
from idempotency_django.middleware import EXEMPT_ATTRIBUTE
from idempotency_django.protection import ViewOptions, protect

__all__ = ["IdempotentMixin", "protect_drf_call", "protect_view_class"]

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

    def call_and_render() -> HttpResponseBase:
        try:
            response = call_handler()
        except Exception as exc:
            # DRF turns APIExceptions into responses (and marks the
            # transaction for rollback); anything else re-raises.
            response = view.handle_exception(exc)
        response = view.finalize_response(request, response, *view.args, **view.kwargs)
        if isinstance(response, Response) and not response.is_rendered:
            response.render()
        return response

    return protect(request, call_and_render, options)


class IdempotentMixin:
    """Protect every unsafe handler of a DRF view or viewset.

    Options as class attribute: ``idempotency_options = ViewOptions(required=True)``.
    A handler decorated with ``@idempotent(...)`` keeps its own options and
    one decorated with ``@idempotency_exempt`` is left alone.
    """

    idempotency_options = ViewOptions()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, handler in _unsafe_handlers(cls, cls.idempotency_options).items():
            setattr(cls, name, handler)

    def initialize_request(self, request: Any, *args: Any, **kwargs: Any) -> Request:
        _read_body_early(request)
        return super().initialize_request(request, *args, **kwargs)  # type: ignore[misc,no-any-return]


def protect_view_class(view_class: ViewClassT, options: ViewOptions) -> ViewClassT:
    """A subclass of ``view_class`` with :class:`IdempotentMixin` applied using ``options``."""
    return type(  # type: ignore[return-value]
        view_class.__name__,
        (IdempotentMixin, view_class),
        {
            "__module__": view_class.__module__,
            "__qualname__": view_class.__qualname__,
            "__doc__": view_class.__doc__,
            "idempotency_options": options,
        },
    )


def _unsafe_handlers(view_class: type, options: ViewOptions) -> dict[str, Callable[..., Any]]:
    names = {name for name in UNSAFE_HANDLERS if callable(getattr(view_class, name, None))}
    get_extra_actions = getattr(view_class, "get_extra_actions", None)
    if get_extra_actions is not None:
        for action in get_extra_actions():
            # An @action maps each HTTP method to a method name; the extra
            # ones come from @my_action.mapping.post and the like.
            names.update(action.mapping.values())
    wrapped = {}
    for name in sorted(names):
        handler = getattr(view_class, name)
        if getattr(handler, EXEMPT_ATTRIBUTE, False) or hasattr(handler, OPTIONS_ATTRIBUTE):
            continue
        wrapped[name] = protect_callable(handler, options)
    return wrapped


def _read_body_early(request: Any) -> None:
    # The fingerprint needs the raw body; read it before authentication or a
    # parser can consume the stream (multipart, the CSRF form-field check).
    settings = idempotency_settings
    if request.method in settings.METHODS and settings.HEADER in request.headers:
        request.body  # noqa: B018  (caches the body on the request)
