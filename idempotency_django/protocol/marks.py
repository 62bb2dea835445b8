"""What a view or a request is marked with, and how to tell the kinds of view and request apart."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from django.http import HttpRequest
from django.http.request import HttpHeaders

#: Set on a view by ``@idempotent`` (or ``@deduplicate_webhook``): protected there.
PROTECTED_ATTRIBUTE = "idempotency_protected"
#: Set on a view or handler by ``@idempotency_exempt``: never protected.
EXEMPT_ATTRIBUTE = "idempotency_exempt"
#: Set on every view ``@deduplicate_webhook`` decorates: it readies its own body (no
#: ``MAX_FINGERPRINTED_BODY``) and decides about its delivery's key; the middleware leaves it alone.
RECEIVER_ATTRIBUTE = "idempotency_webhook_receiver"
#: Where a handler decorated with ``@idempotent(...)`` keeps its own options.
OPTIONS_ATTRIBUTE = "idempotency_options"
#: Set on a django-ninja operation protected by ``idempotency_django.ninja``: its options.
NINJA_OPTIONS_ATTRIBUTE = "idempotency_ninja_options"
#: Where the ninja integration keeps the operation's own function, under its wrapper.
NINJA_INNER_ATTRIBUTE = "_idempotency_inner"
#: Set on the Django request while its key is claimed, so that a second layer
#: (a DRF handler calling an inherited protected handler) stays out.
ACTIVE_ATTRIBUTE = "_idempotency_active"
#: Set on the Django request by phase 1: "protected" once a part of the
#: library took charge of its key, "anonymous" when it let it through.
DECISION_ATTRIBUTE = "_idempotency_decision"
#: Set on the Django request by a claim: the :class:`RecordKey` the request
#: holds (what :func:`idempotency_django.downstream.downstream_key` derives from).
KEY_ATTRIBUTE = "_idempotency_key"
#: Set on the Django request by a claim, beside ``KEY_ATTRIBUTE``: the request's
#: fingerprint, what tells a retry (the same) from a fixed or new request.
FINGERPRINT_ATTRIBUTE = "_idempotency_fingerprint"
#: Set on the Django request by :func:`key_header`: the key header's raw value (None
#: when absent), read once and handed on to every later reader of the request.
KEY_HEADER_ATTRIBUTE = "_idempotency_key_header"
#: Set on the Django request by :func:`note_handled_exception`: the exception
#: DRF or ninja turned into the response, for a ``RETAIN_FUNCTION`` to look at.
HANDLED_EXCEPTION_ATTRIBUTE = "_idempotency_handled_exception"


@functools.cache
def drf_api_view_class() -> type | None:
    """DRF's ``APIView``, or None when DRF is not installed (it is optional)."""
    try:
        from rest_framework.views import APIView
    except ImportError:
        return None
    return APIView


#: What :func:`drf_protection` finds for a DRF view's method: the library protects it
#: (an ``IdempotentMixin`` view, a handler under ``@idempotent``); it may (no mark on
#: the handler: ``@idempotent`` may be on a method the handler calls, ``create``); it
#: does not (``@idempotency_exempt``, or a method the view does not answer).
DRF_PROTECTED, DRF_UNMARKED, DRF_LEFT_ALONE = "protected", "unmarked", "left alone"


def drf_protection(view_func: Callable[..., Any], method: str) -> str | None:
    """None for a view DRF's ``as_view()`` did not make (``@api_view`` makes one); for one
    it made, what the library does with ``method`` of it (``DRF_*``). One look, for the
    middleware's every keyed request."""
    view_class = getattr(view_func, "cls", None)
    api_view = drf_api_view_class()
    if api_view is None or not isinstance(view_class, type) or not issubclass(view_class, api_view):
        return None
    name = method.lower()
    initkwargs: dict[str, Any] = getattr(view_func, "initkwargs", None) or {}
    allowed = initkwargs.get("http_method_names") or getattr(view_class, "http_method_names", None)
    if name not in (allowed or ()):
        return DRF_LEFT_ALONE  # DRF answers 405
    actions = getattr(view_func, "actions", None)  # a viewset's: method -> action
    handler = getattr(view_class, actions.get(name, name) if actions else name, None)
    func = getattr(handler, "__func__", handler)
    if func is None:
        return DRF_LEFT_ALONE
    # @api_view's handler calls the function it was given, which bears the marks.
    marked = [func]
    for cell in getattr(func, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # a cell not filled yet
            marked.append(cell.cell_contents)
    protection = DRF_PROTECTED if getattr(view_class, PROTECTED_ATTRIBUTE, False) else None
    for each in marked:  # a loop, not any(): once per keyed request, no generator
        if getattr(each, EXEMPT_ATTRIBUTE, False) or getattr(each, RECEIVER_ATTRIBUTE, False):
            return DRF_LEFT_ALONE
        if getattr(each, PROTECTED_ATTRIBUTE, False):
            protection = DRF_PROTECTED
    return protection or DRF_UNMARKED


def is_ninja_view(view_func: Callable[..., Any]) -> bool:
    """A URL view of django-ninja: it authenticates inside, after every middleware."""
    return getattr(view_func, "__module__", None) == "ninja.operation"


def ninja_protection(view_func: Callable[..., Any], method: str) -> str | None:
    """None for a view that is not django-ninja's; for one, ``DRF_PROTECTED`` when
    ``idempotency_django.ninja`` protects its operation for ``method``, else ``DRF_LEFT_ALONE``.

    ninja authenticates inside its view, after every middleware: only the
    integration, which claims the key after authentication, knows whose key it
    is. The middleware would scope it by a session ninja may not authenticate,
    and replay the answer to that session.
    """
    if not is_ninja_view(view_func):
        return None
    for operation in _ninja_operations(view_func):
        if method in getattr(operation, "methods", ()):
            if getattr(operation, NINJA_OPTIONS_ATTRIBUTE, None) is not None:
                return DRF_PROTECTED
            break
    return DRF_LEFT_ALONE


def unprotected_ninja_methods(view_func: Callable[..., Any], methods: Any) -> set[str]:
    """The ``methods`` a django-ninja URL view serves without ``idempotency_django.ninja``."""
    found: set[str] = set()
    for operation in _ninja_operations(view_func):
        func = getattr(operation, "view_func", None)
        if getattr(operation, NINJA_OPTIONS_ATTRIBUTE, None) is None and not (
            getattr(func, EXEMPT_ATTRIBUTE, False)
            or getattr(getattr(func, NINJA_INNER_ATTRIBUTE, None), EXEMPT_ATTRIBUTE, False)
        ):
            found.update(set(getattr(operation, "methods", ())) & set(methods))
    return found


def _ninja_operations(view_func: Callable[..., Any]) -> Iterator[Any]:
    """The operations behind a django-ninja URL view, found without importing ninja.

    Its URL views are closures over their ``PathView``, whose ``operations``
    each list their ``methods``.
    """
    for cell in getattr(view_func, "__closure__", None) or ():
        try:
            owner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield from getattr(owner, "operations", None) or ()


def is_drf_request(obj: Any) -> bool:
    request_class = _drf_request_class()
    return request_class is not None and isinstance(obj, request_class)


@functools.cache
def _drf_request_class() -> type | None:
    try:
        from rest_framework.request import Request
    except ImportError:
        return None
    return Request


def find_request(args: tuple[Any, ...]) -> HttpRequest:
    """The request among a view's arguments: ``(request, ...)`` or ``(self, request, ...)``."""
    for arg in args[:2]:
        if isinstance(arg, HttpRequest) or is_drf_request(arg):
            return arg  # type: ignore[no-any-return]
    raise TypeError("@idempotent: the view was called without a request.")


def django_request(request: HttpRequest) -> HttpRequest:
    """The Django request under a DRF one: flags set on it are seen by both."""
    return getattr(request, "_request", request)


def note_handled_exception(request: HttpRequest, error: Exception) -> None:
    """An integration's handlers (DRF's, ninja's) answered ``error``: a retain function sees it."""
    setattr(django_request(request), HANDLED_EXCEPTION_ATTRIBUTE, error)


def decide(request: HttpRequest, decision: str) -> None:
    """Note what became of the request's key: "protected" or "anonymous"."""
    setattr(getattr(request, "_request", request), DECISION_ATTRIBUTE, decision)


#: What :func:`key_header` finds on a request it has not read the header of yet.
_NOT_READ = object()


def forget_claim(request: HttpRequest) -> None:
    """What a claim left on the request (its key, its fingerprint) is no longer its own:
    one GraphQL request runs several mutations, each with a key of its own or none."""
    django = getattr(request, "_request", request)
    for name in (KEY_ATTRIBUTE, FINGERPRINT_ATTRIBUTE):
        django.__dict__.pop(name, None)


def key_header(request: HttpRequest, name: str) -> str | None:
    """The raw value of the key header ``name`` (``HEADER``), or None: read once per request.

    The middleware, the DRF view and phase 1 each need it; the first reads
    ``request.META`` and keeps the value on the Django request for the others.
    """
    django = getattr(request, "_request", request)
    # Not a try/except KeyError: the first reader of every keyed request would raise it.
    value = django.__dict__.get(KEY_HEADER_ATTRIBUTE, _NOT_READ)
    if value is not _NOT_READ:
        return value  # type: ignore[no-any-return]
    value = django.META.get(meta_name(name))  # header(), without a call per keyed request
    if value is not None:
        value = str(value)
    setattr(django, KEY_HEADER_ATTRIBUTE, value)
    return value  # type: ignore[no-any-return]


def header(request: HttpRequest, name: str) -> str | None:
    """A request header's value, read in ``request.META``.

    The same value ``request.headers`` holds, without building that mapping
    (a copy of every header) on requests where nothing else needs it.
    """
    value = request.META.get(meta_name(name))
    return None if value is None else str(value)


@functools.cache
def meta_name(name: str) -> str:
    """The ``request.META`` key of the header ``name``."""
    return str(HttpHeaders.to_wsgi_name(name))
