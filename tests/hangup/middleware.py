from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase


class FailOnTheWayOut:
    """Raises after the view answered when the request carries ``X-Fail-After``: a
    middleware that breaks in its response path once, listed after the idempotency one
    (a retry without the header goes through). Sync and async, as Django's own are."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self.checked(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        return self.checked(request, await self.get_response(request))

    def checked(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if "HTTP_X_FAIL_AFTER" in request.META:
            raise RuntimeError("a later middleware failed on the way out")
        return response


class SyncOnly:
    """An old-style middleware that can only run sync: under ASGI, the middleware
    before it runs sync too (Django adapts it in a worker thread)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)
