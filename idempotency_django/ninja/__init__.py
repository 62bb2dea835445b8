"""django-ninja integration: protect an operation, a router or a whole ``NinjaAPI``::

    from idempotency_django.ninja import idempotent

    @api.post("/orders", auth=TokenAuth(), response={201: OrderOut})
    @idempotent(required=True)
    def create_order(request, payload: OrderIn): ...

    router.add_decorator(idempotent(), mode="view")  # every operation of a router
    api.add_decorator(idempotent(), mode="view")     # of the whole API

django-ninja authenticates inside its view, after every middleware, so ``idempotent`` is
a ninja *view* decorator: ninja hands it each operation's ``run`` when it binds the
operation, and the operation's function is replaced with one that ninja calls after its
authentication, throttling and input validation. That one makes ninja's real response
*before* it is stored: a stored answer is the bytes the client got, and a result ninja
cannot serialize is an error of the attempt, never a 500 after the answer was kept.
Nothing else in the package imports django-ninja.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, Unpack, overload

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja.decorators import decorate_view
from ninja.operation import AsyncOperation, Operation

from idempotency_django.conf import idempotency_settings
from idempotency_django.decorators import IdempotentOptions
from idempotency_django.ninja.openapi import operation_openapi_extra
from idempotency_django.ninja.scope import (
    AUTHENTICATED_BY_ATTRIBUTE,
    PRINCIPAL_ATTRIBUTE,
    auth_principal,
    ninja_scope,
)
from idempotency_django.protocol.bodies import BodyRefused, BodyTooLarge, prepare_body
from idempotency_django.protocol.marks import (
    EXEMPT_ATTRIBUTE,
    NINJA_INNER_ATTRIBUTE,
    NINJA_OPTIONS_ATTRIBUTE,
    key_header,
)
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import aprotect, protect, work_interrupted

__all__ = ["PRINCIPAL_ATTRIBUTE", "NinjaIdempotency", "auth_principal", "idempotent", "ninja_scope"]

FuncT = TypeVar("FuncT", bound=Callable[..., Any])

#: On a protected operation's function: the ``openapi_extra`` the operation had before.
_BASE_EXTRA_ATTRIBUTE = "_idempotency_base_openapi_extra"
#: On a protected operation: the :class:`NinjaIdempotency` that protects it.
_PROTECTION_ATTRIBUTE = "_idempotency_protection"
#: On a keyed request whose body is over ``MAX_FINGERPRINTED_BODY``: its refusal.
_TOO_LARGE_ATTRIBUTE = "_idempotency_body_too_large"


class NinjaIdempotency:
    """The protection of ninja operations, with its :class:`ViewOptions`, made by
    :func:`idempotent`: apply it to an operation's function (below ``@api.post(...)``,
    or through ``decorate_view``: either wins over its router's or its API's), or add it
    to a router or an API with ``add_decorator(..., mode="view")``."""

    def __init__(self, options: ViewOptions, *, operation_level: bool = False) -> None:
        self.options = options
        self.operation_level = operation_level

    def __repr__(self) -> str:
        return f"idempotent({self.options!r})"

    def __call__(self, target: FuncT) -> FuncT:
        operation = _operation_of(target)
        if operation is not None:  # ninja binds an operation and hands us its ``run``
            return self.protect_operation(operation, target)
        if hasattr(target, "_ninja_operation"):
            raise TypeError(
                "idempotency_django.ninja.idempotent must be applied below @api.post(...) "
                "(or given to add_decorator(..., mode='view')): as an operation decorator "
                "it would run before ninja's authentication is known."
            )
        # On an operation's function: ninja calls us with the operation's ``run`` once it
        # has made the operation, and again for every copy.
        return decorate_view(NinjaIdempotency(self.options, operation_level=True))(target)

    def protect_operation(self, operation: Operation, run: FuncT) -> FuncT:
        """Protect one bound operation; return its ``run``, which readies the body first."""
        inner = getattr(operation.view_func, NINJA_INNER_ATTRIBUTE, operation.view_func)
        if getattr(inner, EXEMPT_ATTRIBUTE, False) or getattr(operation, "stream_format", None):
            return run  # exempt, or a stream (never kept)
        if not self.operation_level and _protected_by_its_own(operation):
            return run  # the operation's own idempotent(...) wins over its router's or API's
        setattr(operation, _PROTECTION_ATTRIBUTE, self)
        base_extra = getattr(operation.view_func, _BASE_EXTRA_ATTRIBUTE, operation.openapi_extra)
        operation.view_func = _protected_function(operation, inner, self.options)
        setattr(operation.view_func, _BASE_EXTRA_ATTRIBUTE, base_extra)
        setattr(operation, NINJA_OPTIONS_ATTRIBUTE, self.options)
        _note_authentication(operation)
        operation.openapi_extra = operation_openapi_extra(operation, base_extra, self.options)
        return _ready_body_first(operation, run)


@overload
def idempotent(view: FuncT) -> FuncT: ...


@overload
def idempotent(view: None = None, **options: Unpack[IdempotentOptions]) -> NinjaIdempotency: ...


def idempotent(view: Any = None, **options: Unpack[IdempotentOptions]) -> Any:
    """Protect a ninja operation, or (with ``add_decorator(..., mode="view")``) a router or API.

    The options are :func:`idempotency_django.decorators.idempotent`'s, each
    defaulting to its ``IDEMPOTENCY`` setting. ``scope`` defaults to
    :func:`ninja_scope` (the principal in ``request.auth``). ``atomic`` runs
    the claim, the operation and the stored answer in one transaction (sync
    operations; Django runs no async view in a transaction).
    """
    protection = NinjaIdempotency(ViewOptions(**options))
    return protection if view is None else protection(view)


def _operation_of(target: Any) -> Operation | None:
    """The operation whose ``run`` ``target`` is (or wraps), else None."""
    bound = inspect.unwrap(
        target, stop=lambda f: isinstance(getattr(f, "__self__", None), Operation)
    )
    owner = getattr(bound, "__self__", None)
    return owner if isinstance(owner, Operation) else None


def _protected_by_its_own(operation: Operation) -> bool:
    """Whether the operation is protected by an ``idempotent`` it was given itself:
    ``@idempotent(...)`` below its route, or ``decorate_view(idempotent(...))``, which
    ninja (1.6+) lists in the operation's ``_run_decorators`` once applied. A router's
    and an API's come later, and are not listed."""
    protection = getattr(operation, _PROTECTION_ATTRIBUTE, None)
    if protection is None:
        return False
    own = getattr(operation, "_run_decorators", ())
    return protection.operation_level or any(decorator is protection for decorator in own)


def _protected_function(
    operation: Operation, inner: Callable[..., Any], options: ViewOptions
) -> Callable[..., Any]:
    """The operation's function, called by ninja after authentication, protected; it
    answers ninja's real response, which ninja passes through as it is."""
    options = dataclasses.replace(options, scope=options.scope or ninja_scope)

    def respond(request: HttpRequest, values: dict[str, Any], result: Any) -> HttpResponseBase:
        # On the response the function set headers and cookies on, as ninja gives it.
        temporal = values.get(operation.signature.response_arg or "")
        if not isinstance(temporal, HttpResponse):
            temporal = operation.api.create_temporal_response(request)
        return operation._result_to_response(request, result, temporal)

    def handled(request: HttpRequest, error: Exception) -> HttpResponseBase:
        # ninja's exception handlers answer HttpError, ValidationError, ...;
        # an error they do not handle is raised again, and releases the key.
        response = operation.api.on_exception(request, error)
        # What it wrote must not commit (the key is released, or a 4xx kept), as DRF
        # does. (An async operation runs in no transaction.)
        work_interrupted(request, error)
        return response

    if _is_async(operation):

        @functools.wraps(inner)
        async def protected_async(request: HttpRequest, **values: Any) -> HttpResponseBase:
            if (refused := _too_large(request)) is not None:
                return refused

            async def call() -> HttpResponseBase:
                try:
                    return respond(request, values, await inner(request, **values))
                except Exception as error:
                    return handled(request, error)

            return await aprotect(request, call, options)

        protected: Callable[..., Any] = protected_async
    else:

        @functools.wraps(inner)
        def protected_sync(request: HttpRequest, **values: Any) -> HttpResponseBase:
            if (refused := _too_large(request)) is not None:
                return refused

            def call() -> HttpResponseBase:
                try:
                    return respond(request, values, inner(request, **values))
                except Exception as error:
                    return handled(request, error)

            return protect(request, call, options)

        protected = protected_sync
    setattr(protected, NINJA_INNER_ATTRIBUTE, inner)
    return protected


def _note_authentication(operation: Operation) -> None:
    """Make ``operation`` note on each request which auth callback authenticated it: ninja
    keeps only what it returned, and two returning the same string are two principals.
    ninja's own loop runs on a copy whose callbacks note themselves; the operation's list
    stays as it is (the schema reads it; a router or the API may set it later)."""
    if "_run_authentication" in vars(operation):
        return  # already noting (an operation protected again, by its router)
    authenticate = type(operation)._run_authentication

    def noting(request: HttpRequest) -> Any:
        view = copy.copy(operation)
        view.auth_callbacks = [_noting(callback) for callback in operation.auth_callbacks]
        return authenticate(view, request)

    operation._run_authentication = noting  # type: ignore[method-assign]


def _noting(callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback``, which notes itself on the request it authenticates; async stays async."""

    def noted(request: HttpRequest, result: Any) -> Any:
        if result:
            setattr(request, AUTHENTICATED_BY_ATTRIBUTE, callback)
        return result

    # As ninja tells one (asgiref's test also knows markcoroutinefunction's mark).
    if (
        iscoroutinefunction(callback)
        or iscoroutinefunction(type(callback).__call__)
        or getattr(callback, "is_async", False)
    ):

        async def noting_async(request: HttpRequest) -> Any:
            result = callback(request)
            return noted(request, await result if inspect.isawaitable(result) else result)

        return noting_async
    return lambda request: noted(request, callback(request))


def _is_async(operation: Operation) -> bool:
    """An ``async def`` operation; ``is_async`` is set only after ninja's callbacks ran."""
    return isinstance(operation, AsyncOperation) or bool(operation.is_async)


def _ready_body_first(operation: Operation, run: FuncT) -> FuncT:
    """``run``, which first readies a keyed request's body for the fingerprint: ninja's
    parsers read it (a form's, an upload's) before the key is claimed. A body over
    ``MAX_FINGERPRINTED_BODY`` is answered 413 when the key is claimed, once ninja has
    authenticated the request (an anonymous one gets its 401 first); one cut short, at
    once (its client is gone)."""
    if _is_async(operation):

        @functools.wraps(run)
        async def async_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            refused = await sync_to_async(_ready)(request) if _keyed(request) else None
            return refused if refused is not None else await run(request, *args, **kwargs)

        return async_run  # type: ignore[return-value]

    @functools.wraps(run)
    def sync_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        refused = _ready(request) if _keyed(request) else None
        return refused if refused is not None else run(request, *args, **kwargs)

    return sync_run  # type: ignore[return-value]


def _keyed(request: HttpRequest) -> bool:
    settings = idempotency_settings
    return bool(
        settings.ENABLED
        and request.method in settings.METHODS
        and key_header(request, settings.HEADER) is not None
    )


def _ready(request: HttpRequest) -> HttpResponseBase | None:
    try:
        prepare_body(request)
    except BodyTooLarge as exc:
        # Nothing read: refused once ninja has authenticated the request (an anonymous
        # one gets its 401 first), before its key is claimed.
        setattr(request, _TOO_LARGE_ATTRIBUTE, exc)
    except BodyRefused as exc:
        return exc.refusal(request)
    return None


def _too_large(request: HttpRequest) -> HttpResponseBase | None:
    """The 413 :func:`_ready` found, now that ninja has authenticated the request."""
    refused: BodyTooLarge | None = request.__dict__.pop(_TOO_LARGE_ATTRIBUTE, None)
    return None if refused is None else refused.refusal(request)
