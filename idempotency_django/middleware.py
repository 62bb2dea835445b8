"""Protects plain Django views. DRF views are left to the DRF integration.

Place it after ``AuthenticationMiddleware`` (it scopes keys by
``request.user``) and after ``CsrfViewMiddleware``: for a keyed request it
calls the view itself, so view middleware listed after it does not run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from idempotency_django.conf import idempotency_settings
from idempotency_django.protection import ViewOptions, aprotect, protect
from idempotency_django.stores import get_store

#: Attribute set on a view by ``@idempotent`` or ``@idempotency_exempt``.
PROTECTED_ATTRIBUTE = "idempotency_protected"
EXEMPT_ATTRIBUTE = "idempotency_exempt"


class IdempotencyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
            # Django awaits a coroutine process_view and runs a sync one in a thread.
            self.process_view = self._aprocess_view  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = await self.get_response(request)
        return response

    async def _aprocess_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        if not _wants_protection(request, view_func):
            return None
        if not iscoroutinefunction(view_func):
            # A sync view under ASGI: the sync path, transaction included, in a thread.
            return await sync_to_async(self._protect_sync_view)(
                request, view_func, view_args, view_kwargs
            )
        return await aprotect(request, lambda: view_func(request, *view_args, **view_kwargs))

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponseBase],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        if not _wants_protection(request, view_func):
            return None
        if iscoroutinefunction(view_func):  # an async view under WSGI
            return async_to_sync(aprotect)(
                request, lambda: view_func(request, *view_args, **view_kwargs)
            )
        return self._protect_sync_view(request, view_func, view_args, view_kwargs)

    def _protect_sync_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponseBase],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase:
        # Django wraps the view in ATOMIC_REQUESTS transactions only when no
        # view middleware answers; since this one answers, it does the same,
        # and for the store's database it lets protect() open the transaction
        # so the stored response commits together with the view's writes.
        non_atomic: set[str] = getattr(view_func, "_non_atomic_requests", set())
        atomic_aliases = [
            alias
            for alias, settings_dict in connections.settings.items()
            if settings_dict["ATOMIC_REQUESTS"] and alias not in non_atomic
        ]
        store_alias = getattr(get_store(), "alias", None)
        view = view_func
        for alias in atomic_aliases:
            if alias != store_alias:
                view = transaction.atomic(using=alias)(view)
        options = ViewOptions(atomic=True if store_alias in atomic_aliases else None)
        return protect(request, lambda: view(request, *view_args, **view_kwargs), options)


def _wants_protection(request: HttpRequest, view_func: Callable[..., Any]) -> bool:
    settings = idempotency_settings
    if request.method not in settings.METHODS or not _handled_here(view_func):
        return False
    # Without a key (and not required) there is nothing to do: Django calls the view.
    return settings.HEADER in request.headers or bool(settings.REQUIRED)


def _handled_here(view_func: Callable[..., Any]) -> bool:
    if getattr(view_func, PROTECTED_ATTRIBUTE, False) or getattr(
        view_func, EXEMPT_ATTRIBUTE, False
    ):
        return False
    return not _is_drf_view(view_func)


def _is_drf_view(view_func: Callable[..., Any]) -> bool:
    view_class = getattr(view_func, "cls", None)
    api_view = drf_api_view_class()
    return (
        api_view is not None and isinstance(view_class, type) and issubclass(view_class, api_view)
    )


def drf_api_view_class() -> type | None:
    """DRF's ``APIView``, or None when DRF is not installed (it is optional)."""
    try:
        from rest_framework.views import APIView
    except ImportError:
        return None
    return APIView
