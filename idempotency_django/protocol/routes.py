"""The URL match of a request, as Django's handler will find it, resolved once per path.

The middleware needs a keyed request's view before Django's handler resolves
the URL (DRF and decorated views protect themselves), and the logs name the
route. Resolving is the costliest step of a keyed request's own work, so recent
matches are kept per URL resolver: a resolver Django replaces starts with none,
and any settings change empties them.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from typing import Any

from django.conf import settings as django_settings
from django.conf.urls.i18n import is_language_prefix_patterns_used
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest
from django.urls import Resolver404, ResolverMatch, URLPattern, URLResolver, get_resolver
from django.utils import translation

LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"
#: Where a request keeps the match found for it before Django's handler resolved.
MATCH_ATTRIBUTE = "_idempotency_match"

#: The most paths remembered per resolver; past it, the memory starts again.
MAX_REMEMBERED = 1024

_matches: weakref.WeakKeyDictionary[
    URLResolver, dict[tuple[str, str | None], ResolverMatch | None]
] = weakref.WeakKeyDictionary()


def match_of(request: HttpRequest) -> ResolverMatch | None:
    """The request's match: Django's when it has resolved, else the one it will find (or None)."""
    match = getattr(request, "resolver_match", None) or getattr(request, MATCH_ATTRIBUTE, None)
    if match is not None:
        return match  # type: ignore[no-any-return]
    urlconf = getattr(request, "urlconf", None)
    resolver = get_resolver(urlconf)
    remembered = _matches.setdefault(resolver, {})
    # The language decides what i18n_patterns and translated routes match: the
    # active one, unless a LocaleMiddleware after ours has yet to choose it.
    language: str | None
    if hasattr(request, "LANGUAGE_CODE") or not _locale_middleware_installed():
        language = translation.get_language()
    else:
        language = _language_of(request, urlconf)
    key = (request.path_info, language)
    try:
        match = remembered[key]
    except KeyError:
        with translation.override(language):
            try:
                match = resolver.resolve(request.path_info)
            except Resolver404:
                match = None
        if len(remembered) >= MAX_REMEMBERED:
            remembered.clear()
        remembered[key] = match
    if match is not None:
        # Kept for the log line and a later caller that was not handed it (a view's
        # own protection without the middleware): resolved once per request.
        setattr(request, MATCH_ATTRIBUTE, match)
    return match


def _language_of(request: HttpRequest, urlconf: str | None) -> str | None:
    """The language a ``LocaleMiddleware`` after ours will choose (as its
    ``process_request`` does), which translated routes and prefixes resolve in."""
    i18n_patterns_used, prefixed_default_language = is_language_prefix_patterns_used(
        urlconf or django_settings.ROOT_URLCONF
    )
    language = translation.get_language_from_request(request, check_path=i18n_patterns_used)
    from_path = translation.get_language_from_path(request.path_info)
    if not from_path and i18n_patterns_used and not prefixed_default_language:
        language = django_settings.LANGUAGE_CODE
    return language


@functools.cache
def _locale_middleware_installed() -> bool:
    return bool(django_settings.USE_I18N) and LOCALE_MIDDLEWARE in django_settings.MIDDLEWARE


@receiver(setting_changed)
def _forget(**kwargs: Any) -> None:
    _matches.clear()
    _locale_middleware_installed.cache_clear()


def walk_patterns(
    patterns: Any, prefix: str = "", has_kwargs: bool = False
) -> Iterator[tuple[str, Any, bool]]:
    """Every view of a URLconf: (route, view, whether its URL passes keyword arguments)."""
    for entry in patterns:
        pattern = entry.pattern
        fixed = getattr(entry, "default_kwargs", None) or getattr(entry, "default_args", None)
        here = has_kwargs or bool(pattern.regex.groupindex) or bool(fixed)
        if isinstance(entry, URLResolver):
            yield from walk_patterns(entry.url_patterns, prefix + str(pattern), here)
        elif isinstance(entry, URLPattern):
            yield prefix + str(pattern), entry.callback, here
