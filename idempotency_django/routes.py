"""The URL match of a request, as Django's handler will find it, resolved once per path.

The middleware needs the view of every keyed request before Django's handler
resolves the URL (to leave DRF views and decorated views to their own
protection), and the logs name the route. Resolving is the costliest step of
a keyed request's own work, so recent matches are kept per URL resolver: a
resolver that Django replaces (``clear_url_caches()``, another
``ROOT_URLCONF``) starts with none, and any settings change empties them.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.http import HttpRequest
from django.urls import Resolver404, ResolverMatch, URLResolver, get_resolver
from django.utils import translation

#: The most paths remembered per resolver; past it, the memory starts again.
MAX_REMEMBERED = 1024

_matches: weakref.WeakKeyDictionary[
    URLResolver, dict[tuple[str, str | None], ResolverMatch | None]
] = weakref.WeakKeyDictionary()


def match_of(request: HttpRequest) -> ResolverMatch | None:
    """The request's match: Django's when it has resolved, else the one it will find (or None)."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match  # type: ignore[no-any-return]
    resolver = get_resolver(getattr(request, "urlconf", None))
    remembered = _matches.setdefault(resolver, {})
    # The active language decides what i18n_patterns match.
    key = (request.path_info, translation.get_language())
    try:
        return remembered[key]
    except KeyError:
        pass
    match = _resolve_as_the_handler_will(resolver, request.path_info)
    if len(remembered) >= MAX_REMEMBERED:
        remembered.clear()
    remembered[key] = match
    return match


def _resolve_as_the_handler_will(resolver: URLResolver, path: str) -> ResolverMatch | None:
    """``i18n_patterns`` match the active language, which a ``LocaleMiddleware``
    listed after the middleware has not activated yet: resolve again with the
    language it will activate (the path's, or ``LANGUAGE_CODE`` for an
    unprefixed default language).
    """
    try:
        return resolver.resolve(path)
    except Resolver404:
        if not django_settings.USE_I18N:
            return None
    language = translation.get_language_from_path(path)
    with translation.override(language or django_settings.LANGUAGE_CODE):
        try:
            return resolver.resolve(path)
        except Resolver404:
            return None


def _forget(**kwargs: Any) -> None:
    _matches.clear()


setting_changed.connect(_forget)
