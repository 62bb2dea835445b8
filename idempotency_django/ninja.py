"""django-ninja integration: protect an operation, a router or a whole ``NinjaAPI``.

django-ninja authenticates inside its view (``auth=`` on an operation, a
router or the API), after every middleware: only there is ``request.auth``
known. So the key is claimed there too, after ninja's authentication,
throttling and input validation, and scoped by the principal ninja
authenticated::

    from idempotency_django.ninja import idempotent

    @api.post("/orders", auth=TokenAuth(), response={201: OrderOut})
    @idempotent(required=True)
    def create_order(request, payload: OrderIn): ...

    router.add_decorator(idempotent(), mode="view")  # every operation of a router
    api.add_decorator(idempotent(), mode="view")     # of the whole API

How: ``idempotent(...)`` is a ninja *view* decorator (``decorate_view``,
``add_decorator(..., mode="view")``), so ninja hands it each operation's
``run`` when it binds the operation to its API. It then replaces the
operation's function with one that ninja calls after authentication, and
that turns the function's result (a schema object, ``Status(...)``, a
``(status, data)`` tuple) into ninja's real response *before* the
response is stored: a stored answer is always the bytes the client got,
and a result ninja cannot serialize is an error of the attempt (its key is
released, its transaction rolled back), never a 500 after the answer was
kept. It also documents the key contract in the API's OpenAPI schema.

This module imports django-ninja; nothing else in the package imports it,
so django-ninja stays optional (``pip install idempotency-django[ninja]``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Unpack, overload

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja.decorators import decorate_view
from ninja.operation import AsyncOperation, Operation

from idempotency_django.conf import header, idempotency_settings
from idempotency_django.decorators import IdempotentOptions
from idempotency_django.fingerprint import BodyTooLarge, prepare_body
from idempotency_django.keys import MAX_KEY_LENGTH
from idempotency_django.marks import (
    EXEMPT_ATTRIBUTE,
    NINJA_INNER_ATTRIBUTE,
    NINJA_OPTIONS_ATTRIBUTE,
    note_handled_exception,
)
from idempotency_django.openapi_contract import (
    KEY_PATTERN,
    PROBLEM_SCHEMA,
    key_description,
    key_required,
    problem_answers,
    problem_examples,
    replayed_header,
    same_request_description,
)
from idempotency_django.options import ViewOptions
from idempotency_django.phases import aprotect, protect
from idempotency_django.problems import PROBLEM_CONTENT_TYPE
from idempotency_django.scope import Scope, location_of, principal_of
from idempotency_django.transactions import roll_back_open_transactions

__all__ = ["PRINCIPAL_ATTRIBUTE", "NinjaIdempotency", "auth_principal", "idempotent", "ninja_scope"]

FuncT = TypeVar("FuncT", bound=Callable[..., Any])

#: An authentication result names its principal with this attribute (or property).
PRINCIPAL_ATTRIBUTE = "idempotency_principal"
#: On a protected operation's function: the function it protects.
_INNER_ATTRIBUTE = NINJA_INNER_ATTRIBUTE
#: On a protected operation's function: the ``openapi_extra`` the operation had before.
_BASE_EXTRA_ATTRIBUTE = "_idempotency_base_openapi_extra"
#: On a protected operation: "operation" when protected by its own ``@idempotent``.
_LEVEL_ATTRIBUTE = "_idempotency_level"
#: Starts the name of an authentication result that is a string: a digest, never the secret.
SECRET_PREFIX = "secret:"


# -- who the key belongs to ----------------------------------------------------


def auth_principal(auth: Any) -> str | None:
    """A name for what ninja's authentication returned (``request.auth``); None for nobody.

    In this order:

    * an object with an ``idempotency_principal`` attribute (or property, or
      method): its value, as it is (make it unique among every kind of
      principal, e.g. ``"partner:42"``); empty or None for nobody;
    * a Django user (``django_auth`` returns ``request.user``, a token auth
      often the token's user): the name the middleware and DRF give it
      (:func:`idempotency_django.scope.principal_of`), so a user's keys are
      the same keys whichever way they came in;
    * a model instance (an ``ApiKey`` row, a ``Client``):
      ``app_label.model:pk``, ``app_label.model@alias:pk`` for one of
      another database than the default one;
    * a string or bytes (an ``APIKeyHeader`` or ``HttpBearer`` that returns
      the key it checked): ``secret:`` and the SHA-256 of it (the key
      itself, a credential, is never stored).

    Anything else (``True``, a number, a dict) names nobody it could be told
    apart from: :class:`~django.core.exceptions.ImproperlyConfigured` is
    raised before the key is claimed, and nothing runs.
    """
    if auth is None or auth is False:
        return None
    named = getattr(auth, PRINCIPAL_ATTRIBUTE, None)
    if named is not None:
        value = named() if callable(named) else named
        return str(value) if value else None
    if hasattr(auth, "is_authenticated"):
        return principal_of(auth)
    meta = getattr(auth, "_meta", None)
    pk = getattr(auth, "pk", None)
    if meta is not None and pk is not None:
        alias = getattr(getattr(auth, "_state", None), "db", None) or DEFAULT_DB_ALIAS
        if alias == DEFAULT_DB_ALIAS:
            return f"{meta.label_lower}:{pk}"
        return f"{meta.label_lower}@{alias}:{pk}"
    if isinstance(auth, str | bytes):
        secret = auth.encode() if isinstance(auth, str) else auth
        return SECRET_PREFIX + hashlib.sha256(secret).hexdigest()
    raise ImproperlyConfigured(
        f"idempotency_django.ninja cannot name the principal of the authentication "
        f"result {type(auth).__name__!r}: return a user, a model instance or a string "
        f"from authenticate(), give the result an {PRINCIPAL_ATTRIBUTE!r} attribute, "
        f"or pass scope= to idempotent()."
    )


def ninja_scope(request: HttpRequest) -> Scope | None:
    """The principal ninja authenticated (``request.auth``) and the ``X-Location-Id`` header.

    An operation without ninja authentication has no ``request.auth``: its
    scope is then the ``SCOPE_FUNCTION`` setting's (the session user, by
    default), as on a plain Django view.
    """
    if not hasattr(request, "auth"):
        scope: Scope | None = idempotency_settings.SCOPE_FUNCTION(request)
        return scope
    principal = auth_principal(request.auth)
    if principal is None:
        return None
    return Scope(principal=principal, location=location_of(request))


# -- the decorator ---------------------------------------------------------------


class NinjaIdempotency:
    """The protection of ninja operations, with its :class:`ViewOptions`.

    Made by :func:`idempotent`. Apply it to an operation's function (below
    ``@api.post(...)``, or through ``decorate_view``), or add it to a router
    or an API with ``add_decorator(..., mode="view")``.
    """

    def __init__(self, options: ViewOptions, *, operation_level: bool = False) -> None:
        self.options = options
        self.operation_level = operation_level

    def __repr__(self) -> str:
        return f"idempotent({self.options!r})"

    def __call__(self, target: FuncT) -> FuncT:
        operation = _operation_of(target)
        if operation is not None:
            # ninja binds an operation and hands us its ``run``.
            return self.protect_operation(operation, target)
        if hasattr(target, "_ninja_operation"):
            raise TypeError(
                "idempotency_django.ninja.idempotent must be applied below @api.post(...) "
                "(or given to add_decorator(..., mode='view')): as an operation decorator "
                "it would run before ninja's authentication is known."
            )
        # On an operation's function: ninja calls us with the operation's
        # ``run`` once it has made the operation, and again for every copy.
        marked = NinjaIdempotency(self.options, operation_level=True)
        return decorate_view(marked)(target)

    def protect_operation(self, operation: Operation, run: FuncT) -> FuncT:
        """Protect one bound operation; return its ``run``, which readies the body first."""
        inner = getattr(operation.view_func, _INNER_ATTRIBUTE, operation.view_func)
        if getattr(inner, EXEMPT_ATTRIBUTE, False) or getattr(operation, "stream_format", None):
            return run  # exempt, or a stream (never kept)
        if getattr(operation, _LEVEL_ATTRIBUTE, None) == "operation" and not self.operation_level:
            return run  # the operation's own @idempotent wins over its router's or API's
        setattr(operation, _LEVEL_ATTRIBUTE, "operation" if self.operation_level else "router")
        base_extra = getattr(operation.view_func, _BASE_EXTRA_ATTRIBUTE, operation.openapi_extra)
        operation.view_func = _protected_function(operation, inner, self.options)
        setattr(operation.view_func, _BASE_EXTRA_ATTRIBUTE, base_extra)
        setattr(operation, NINJA_OPTIONS_ATTRIBUTE, self.options)
        operation.openapi_extra = _openapi_extra(operation, self.options, base_extra)
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


# -- running an operation --------------------------------------------------------


def _operation_of(target: Any) -> Operation | None:
    """The operation whose ``run`` ``target`` is (or wraps), else None."""
    seen = 0
    while target is not None and seen < 100:
        owner = getattr(target, "__self__", None)
        if isinstance(owner, Operation):
            return owner
        target = getattr(target, "__wrapped__", None)
        seen += 1
    return None


def _protected_function(
    operation: Operation, inner: Callable[..., Any], options: ViewOptions
) -> Callable[..., Any]:
    """The operation's function, called by ninja after authentication, protected.

    It answers ninja's real response: ninja passes a response through as it is.
    """
    options = dataclasses.replace(options, scope=options.scope or ninja_scope)

    def handled(request: HttpRequest, error: Exception) -> HttpResponseBase:
        # ninja's exception handlers answer HttpError, ValidationError, ...;
        # an error they do not handle is raised again, and releases the key.
        response = operation.api.on_exception(request, error)
        note_handled_exception(request, error)
        return response

    if _is_async(operation):

        @functools.wraps(inner)
        async def protected_async(request: HttpRequest, **values: Any) -> HttpResponseBase:
            async def call() -> HttpResponseBase:
                temporal = _temporal_response(operation, request, values)
                try:
                    result = await inner(request, **values)
                    return operation._result_to_response(request, result, temporal)
                except Exception as error:
                    return handled(request, error)

            return await aprotect(request, call, options)

        protected: Callable[..., Any] = protected_async
    else:

        @functools.wraps(inner)
        def protected_sync(request: HttpRequest, **values: Any) -> HttpResponseBase:
            def call() -> HttpResponseBase:
                temporal = _temporal_response(operation, request, values)
                try:
                    result = inner(request, **values)
                    return operation._result_to_response(request, result, temporal)
                except Exception as error:
                    response = handled(request, error)
                    # The error interrupted the work: what it wrote must not
                    # commit (the key is released, or a 4xx kept), as DRF does.
                    roll_back_open_transactions()
                    return response

            return protect(request, call, options)

        protected = protected_sync
    setattr(protected, _INNER_ATTRIBUTE, inner)
    return protected


def _is_async(operation: Operation) -> bool:
    """An ``async def`` operation; ``is_async`` is set only after ninja's callbacks ran."""
    return isinstance(operation, AsyncOperation) or bool(operation.is_async)


def _temporal_response(
    operation: Operation, request: HttpRequest, values: dict[str, Any]
) -> HttpResponse:
    """The response the function may set headers and cookies on, as ninja gives it."""
    name = operation.signature.response_arg
    given = values.get(name) if name else None
    if isinstance(given, HttpResponse):
        return given
    return operation.api.create_temporal_response(request)


def _ready_body_first(operation: Operation, run: FuncT) -> FuncT:
    """``run``, which first readies a keyed request's body for the fingerprint.

    ninja's parsers read the body (a form's, a file upload's) before the key
    is claimed; read first, it stays readable for both. A body over
    ``MAX_FINGERPRINTED_BODY`` is answered 413 before anything runs.
    """
    if _is_async(operation):

        @functools.wraps(run)
        async def async_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if _keyed(request):
                refused = await sync_to_async(_ready)(request)
                if refused is not None:
                    return refused
            result: Awaitable[Any] = run(request, *args, **kwargs)
            return await result

        return async_run  # type: ignore[return-value]

    @functools.wraps(run)
    def sync_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if _keyed(request):
            refused = _ready(request)
            if refused is not None:
                return refused
        return run(request, *args, **kwargs)

    return sync_run  # type: ignore[return-value]


def _keyed(request: HttpRequest) -> bool:
    settings = idempotency_settings
    return (
        settings.ENABLED
        and request.method in settings.METHODS
        and header(request, settings.HEADER) is not None
    )


def _ready(request: HttpRequest) -> HttpResponseBase | None:
    try:
        prepare_body(request)
    except BodyTooLarge as exc:
        return exc.answer(request)
    return None


# -- the OpenAPI schema ----------------------------------------------------------


def _openapi_extra(
    operation: Operation, options: ViewOptions, base: dict[str, Any] | None
) -> dict[str, Any]:
    """``base`` (the operation's own ``openapi_extra``) and the key contract, for ninja to merge.

    Read when the API is bound (``api.urls``): the schema shows the settings of then.
    """
    extra = copy.deepcopy(base) if base else {}
    if operation.methods and not set(operation.methods) & set(idempotency_settings.METHODS):
        return extra
    required = key_required(options.required)
    parameter = {
        "in": "header",
        "name": idempotency_settings.HEADER,
        "required": required,
        "description": key_description(required, same_request_description(options.fingerprint)),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_KEY_LENGTH,
            "pattern": KEY_PATTERN,
        },
    }
    parameters = extra.setdefault("parameters", [])
    if not any(
        isinstance(p, dict) and p.get("in") == "header" and p.get("name") == parameter["name"]
        for p in parameters
    ):
        parameters.insert(0, parameter)
    responses = extra.setdefault("responses", {})
    documented = {status for status in operation.response_models if isinstance(status, int)}
    for status in documented:
        if 200 <= status < 300:
            response = responses.setdefault(status, {})
            response.setdefault("headers", {}).setdefault(
                idempotency_settings.REPLAYED_HEADER, replayed_header()
            )
    for status, description, codes, headers in problem_answers(required):
        response = responses.setdefault(status, {})
        if status not in documented:
            response.setdefault("description", description)
        response.setdefault("content", {}).setdefault(
            PROBLEM_CONTENT_TYPE,
            {"schema": copy.deepcopy(PROBLEM_SCHEMA), "examples": problem_examples(status, codes)},
        )
        for name, value in headers.items():
            response.setdefault("headers", {}).setdefault(name, copy.deepcopy(value))
    return extra
