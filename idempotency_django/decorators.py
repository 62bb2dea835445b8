"""``@idempotent`` and ``@idempotency_exempt`` for function views, class-based views and DRF."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar, Unpack, overload

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.views import View

from idempotency_django.protocol.marks import (
    EXEMPT_ATTRIBUTE,
    OPTIONS_ATTRIBUTE,
    PROTECTED_ATTRIBUTE,
    drf_api_view_class,
    find_request,
    is_drf_request,
    is_ninja_view,
)
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import aprotect, protect

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


class IdempotentOptions(TypedDict, total=False):
    """The keyword options of ``@idempotent`` (and of the ninja integration's).

    They are :class:`~idempotency_django.protocol.options.ViewOptions`' fields; a function
    option takes the request a view gets (Django's, DRF's or ninja's).
    """

    required: bool | None
    retention: int | None
    retain_client_errors: bool | None
    atomic: bool | None
    max_stored_body: int | None
    wait_for_in_progress: float | None
    fingerprint: Callable[[Any], str] | str | None
    scope: Callable[[Any], Any] | str | None
    retain: Callable[[Any, Any, Any], bool] | str | None
    window: int | None


@overload
def idempotent(view: ViewT) -> ViewT: ...


@overload
def idempotent(
    view: None = None, **options: Unpack[IdempotentOptions]
) -> Callable[[ViewT], ViewT]: ...


def idempotent(view: Any = None, **options: Unpack[IdempotentOptions]) -> Any:
    """Protect a view (function, class-based view, DRF view or viewset, or one action).

    ``required``: answer 400 ``idempotency_key_missing`` when the key is absent.
    ``retention``: seconds to keep the stored response. ``retain_client_errors``:
    keep 4xx responses too. ``atomic``: run the view in a transaction that also
    stores its response. ``max_stored_body``: bytes above which a response is
    not kept. ``wait_for_in_progress``: seconds a duplicate waits for the
    request it duplicates. ``fingerprint`` and ``scope``: functions (or dotted
    paths) used instead of ``FINGERPRINT_FUNCTION`` and ``SCOPE_FUNCTION``, for
    example [`json_fields`][idempotency_django.protocol.fingerprint.json_fields]. ``retain``:
    a function ``(request, response, exception) -> bool`` (or its dotted path) that
    says whether an answer is kept, used instead of ``RETAIN_FUNCTION`` (a 5xx never
    is). ``window``: seconds in which an authenticated request that carries no key
    gets the answer of the same request (method, path, body) its principal sent
    before, or ``409`` while that one runs: for clients that mint no key. Each
    other option defaults to the ``IDEMPOTENCY`` setting.
    """
    view_options = ViewOptions(**options)

    def decorate(target: Any) -> Any:
        if isinstance(target, type):
            return _protect_class(target, view_options)
        return protect_callable(target, view_options)

    return decorate if view is None else decorate(view)


def idempotency_exempt(view: ViewT) -> ViewT:
    """Never protect this view or action, whatever the middleware or class decoration."""
    setattr(view, EXEMPT_ATTRIBUTE, True)
    return view


def protect_callable(func: Callable[..., Any], options: ViewOptions) -> Callable[..., Any]:
    """Wrap a function view, a DRF ``@api_view`` function body, or a view method."""
    if getattr(func, "cls", None) is not None:
        raise TypeError(
            "@idempotent must be applied below @api_view (or to the view class), "
            "so that it sees the request DRF authenticated."
        )

    if iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            request = find_request(args)
            refuse_ninja(request)
            return await aprotect(request, lambda: func(*args, **kwargs), options)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            request = find_request(args)
            refuse_ninja(request)
            if is_drf_request(request):
                from idempotency_django.drf import protect_drf_call

                return protect_drf_call(request, lambda: func(*args, **kwargs), options)  # type: ignore[arg-type]
            return protect(request, lambda: func(*args, **kwargs), options)

        wrapper = sync_wrapper

    setattr(wrapper, PROTECTED_ATTRIBUTE, True)
    setattr(wrapper, OPTIONS_ATTRIBUTE, options)
    return wrapper


def refuse_ninja(request: Any) -> None:
    """Before any claim: this ``@idempotent`` cannot protect a django-ninja operation.

    ninja calls the operation with its own result types (a ``(status, data)``
    tuple, a schema) and makes the response after it: only the ninja
    integration sees both the authenticated principal and the response.
    """
    match = getattr(request, "resolver_match", None)
    if match is not None and is_ninja_view(match.func):
        raise ImproperlyConfigured(
            "idempotency_django.idempotent cannot protect a django-ninja operation: "
            "use idempotency_django.ninja.idempotent (docs/ninja.md)."
        )


def _protect_class(view_class: type, options: ViewOptions) -> type:
    drf_view = drf_api_view_class()
    if drf_view is not None and issubclass(view_class, drf_view):
        from idempotency_django.drf import IdempotentMixin

        mixin = () if issubclass(view_class, IdempotentMixin) else (IdempotentMixin,)
        return _subclass(view_class, *mixin, idempotency_options=options)
    if issubclass(view_class, View):
        dispatch: Callable[..., Any] = view_class.dispatch
        if view_class.view_is_async:
            # Its dispatch returns the handler's coroutine: awaited in the protection, so
            # the answer stored is the handler's response.
            sync_dispatch = dispatch

            @functools.wraps(sync_dispatch)
            async def async_dispatch(*args: Any, **kwargs: Any) -> Any:
                return await sync_dispatch(*args, **kwargs)

            dispatch = async_dispatch
        return _subclass(view_class, dispatch=_unless_the_handler_decides(dispatch, options))
    raise TypeError(f"@idempotent cannot protect {view_class!r}: not a Django or DRF view.")


def _unless_the_handler_decides(
    dispatch: Callable[..., Any], options: ViewOptions
) -> Callable[..., Any]:
    """A class-based view's ``dispatch``, protected with the class's options unless the
    handler of the request's method decides itself: under ``@idempotency_exempt``, or
    under ``@idempotent(...)`` with options of its own (as a DRF action's do)."""
    protected = protect_callable(dispatch, options)

    def chosen(view: View, request: HttpRequest) -> Callable[..., Any]:
        handler = getattr(view, str(request.method).lower(), None)
        if getattr(handler, EXEMPT_ATTRIBUTE, False) or getattr(
            handler, PROTECTED_ATTRIBUTE, False
        ):
            return dispatch
        return protected

    if iscoroutinefunction(protected):

        @functools.wraps(protected)
        async def async_dispatch(view: View, request: HttpRequest, *args: Any, **kw: Any) -> Any:
            return await chosen(view, request)(view, request, *args, **kw)

        return async_dispatch

    @functools.wraps(protected)
    def sync_dispatch(view: View, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return chosen(view, request)(view, request, *args, **kwargs)

    return sync_dispatch


def _subclass(view_class: type, *mixins: type, **attributes: Any) -> type:
    """A subclass of ``view_class`` that bears its name, module and docstring."""
    names = {name: getattr(view_class, name) for name in ("__module__", "__qualname__", "__doc__")}
    return type(view_class.__name__, (*mixins, view_class), {**names, **attributes})
