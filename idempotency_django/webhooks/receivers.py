"""Webhook receivers found by their URL: for log lines, and for the system check."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from django.core import checks
from django.http import HttpRequest
from django.urls import Resolver404, ResolverMatch, get_resolver, resolve

from idempotency_django.protocol.marks import RECEIVER_ATTRIBUTE as RECEIVER_ATTRIBUTE
from idempotency_django.protocol.routes import walk_patterns

#: Set on a receiver: True when it names its namespace itself.
NAMESPACE_ATTRIBUTE = "idempotency_webhook_namespace"


class RedactTriggerURLs(logging.Filter):
    """A receiver's route in place of its URL in Django's log lines.

    A trigger token is in the receiver's URL, and Django logs URLs: each
    4xx/5xx on ``django.request`` (``"Bad Request: /hooks/<the token>/"``), a
    CSRF failure on ``django.security.csrf``, every request line of runserver
    on ``django.server``. For views decorated with
    :func:`~idempotency_django.webhooks.deduplicate_webhook` this filter puts
    the URL pattern (``hooks/<str:token>/``) in its place; other URLs are left
    alone. The app installs it on those three loggers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.args, tuple) or not record.args:
            return True
        request = getattr(record, "request", None)
        if isinstance(request, HttpRequest):
            match = getattr(request, "resolver_match", None)
            if match is None:  # answered before URL resolution, by a middleware
                route = _receiver_route(request.path_info, getattr(request, "urlconf", None))
            else:
                route = _route_if_receiver(match)
            urls = {request.path, request.path_info, request.get_full_path()}
            # Django's log_response escapes its arguments (non-ASCII, backslashes).
            urls |= {url.encode("unicode_escape").decode("ascii") for url in urls}
        else:  # runserver's ("POST /hooks/<the token>/?a=b HTTP/1.1", status, size)
            words = record.args[0].split(" ") if isinstance(record.args[0], str) else []
            if len(words) < 2:
                return True
            route, urls = _receiver_route(unquote(urlsplit(words[1]).path)), {words[1]}
        if route is not None:
            longest_first = sorted(urls, key=len, reverse=True)
            record.args = tuple(
                _replaced(arg, longest_first, route) if isinstance(arg, str) else arg
                for arg in record.args
            )
        return True


def _replaced(text: str, urls: list[str], route: str) -> str:
    for url in urls:
        text = text.replace(url, route)
    return text


def _receiver_route(path: str, urlconf: str | None = None) -> str | None:
    """The route of the receiver at ``path``, or None when it is not one.

    A receiver's URL without its trailing slash counts: its token is real, and
    ``APPEND_SLASH`` answers it with a redirect that servers log.
    """
    for candidate in (path,) if path.endswith("/") else (path, path + "/"):
        try:
            return _route_if_receiver(resolve(candidate, urlconf))
        except Resolver404:
            continue
    return None


def _route_if_receiver(match: ResolverMatch) -> str | None:
    return str(match.route) if _receiver_handler(match.func) is not None else None


def _receiver_handler(view: Callable[..., Any]) -> Any:
    """The function ``@deduplicate_webhook`` decorated behind ``view`` (or its class's handler)."""
    view_class = getattr(view, "view_class", None) or getattr(view, "cls", None)
    names = [*getattr(view_class, "http_method_names", ()), *getattr(view, "actions", {}).values()]
    handlers = (view, *(getattr(view_class, name, None) for name in names))
    for handler in handlers:
        if getattr(handler, RECEIVER_ATTRIBUTE, False):
            return handler
        # @api_view keeps the decorated function only in its handler's closure.
        for cell in getattr(handler, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                if getattr(cell.cell_contents, RECEIVER_ATTRIBUTE, False):
                    return cell.cell_contents
    return None


@checks.register(checks.Tags.urls)
def check_receiver_namespaces(**kwargs: Any) -> list[checks.CheckMessage]:
    """A receiver whose URL has no keyword argument shares one namespace with every sender.

    Two senders (or two tenants) posting to it with the same delivery id would
    make each other's deliveries "duplicates", and the fallback identity has
    no secret token in it.
    """
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is Django's own check to report
        return []
    return [
        checks.Warning(
            f"The webhook receiver at {route!r} has no namespace: its URL has no keyword "
            "argument (a trigger token, a tenant) and it names no namespace.",
            hint="Put a trigger token in its URL (hooks/<str:token>/), or pass "
            "@deduplicate_webhook(namespace=...).",
            id="idempotency_django.W030",
        )
        for route, view, has_kwargs in walk_patterns(patterns)
        if not has_kwargs
        and (handler := _receiver_handler(view)) is not None
        and not getattr(handler, NAMESPACE_ATTRIBUTE, False)
    ]
