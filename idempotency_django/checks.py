"""System checks: the middleware's place, the settings' values, the store's configuration."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
from collections.abc import Callable, Iterable, Iterator
from math import inf
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from django.conf import settings
from django.core import checks
from django.shortcuts import resolve_url
from django.urls import NoReverseMatch, get_resolver, reverse
from django.utils.module_loading import import_string

from idempotency_django import conf
from idempotency_django.conf import DEFAULTS, SETTING_NAME, idempotency_settings
from idempotency_django.protocol import marks
from idempotency_django.protocol.options import MAX_SECONDS
from idempotency_django.protocol.retention import retain_successes
from idempotency_django.protocol.routes import walk_patterns

MIDDLEWARE_PATH = "idempotency_django.middleware.IdempotencyMiddleware"
#: Sets request.user, which scopes keys: it must run before ours.
AUTHENTICATION_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"
GZIP_PATH = "django.middleware.gzip.GZipMiddleware"
SESSION_PATH = "django.contrib.sessions.middleware.SessionMiddleware"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
#: The plain types a setting's annotation may be made of; the others are checked one by one.
PLAIN_TYPES = {bool, int, float, str, bytes, NoneType}
#: Settings whose every condition a check of their own reports (E015: the keys).
OWN_CHECKS = {"ENCRYPTION_KEY"}


def _is_number(value: Any, types: type | tuple[type, ...] = (int, float)) -> bool:
    """Whether ``value`` is one of ``types``, and not a bool (which is an int to Python)."""
    return isinstance(value, types) and not isinstance(value, bool)


def _is_heartbeat(value: Any) -> bool:
    if not isinstance(value, dict):
        return value is None or _is_number(value)
    max_run_time = value.get("MAX_RUN_TIME", conf.DEFAULT_MAX_RUN_TIME)
    has_its_keys = "INTERVAL" in value and set(value) <= {"INTERVAL", "MAX_RUN_TIME"}
    return has_its_keys and _is_number(value["INTERVAL"]) and _is_number(max_run_time, int)


def _are_marker_headers(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) <= set(DEFAULTS["MARKER_HEADERS"])
        and all(name is None or isinstance(name, str) for name in value.values())
        and bool(value.get("REPLAYED", "x"))
    )


def _strings(value: Any) -> bool:
    """A list, tuple or set of strings, not one string."""
    return isinstance(value, list | tuple | set | frozenset) and all(
        isinstance(item, str) for item in value
    )


#: The settings whose annotation is the type a read gives, not a setting's: (whether a
#: value has the setting's shape, what it must be).
SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "HEARTBEAT": (
        _is_heartbeat,
        "must be None, a number of seconds, or a dict of "
        "INTERVAL (seconds) and MAX_RUN_TIME (whole seconds).",
    ),
    "MARKER_HEADERS": (
        _are_marker_headers,
        "must be a dict of REPLAYED (a header name), "
        "KEY_IGNORED and KEY_ECHO (a header name, or None).",
    ),
    "REQUIRED_PATHS": (
        lambda value: _strings(value),
        "must be a list of regular expressions (strings).",
    ),
    # A string would be read a character each: ("Content-Type") without its comma.
    "METHODS": (lambda value: _strings(value), "must be a list of method names (strings)."),
    "REPLAY_HEADERS": (lambda value: _strings(value), "must be a list of header names (strings)."),
}
#: Numbers that must be above 0 (None, where the type allows it, is "no limit").
POSITIVE = (
    *("LOCK_TIMEOUT", "RETENTION", "RETRY_AFTER", "WEBHOOK_RETENTION"),
    *("MAX_STORED_BODY", "MAX_KEYS_PER_PRINCIPAL", "MAX_FINGERPRINTED_BODY"),
)
#: Seconds that become a record's expiry: at most MAX_SECONDS, which the stores can write.
EXPIRIES = ("LOCK_TIMEOUT", "RETENTION", "WEBHOOK_RETENTION")


def _listed(
    problems: Callable[..., Iterable[checks.CheckMessage]],
) -> Callable[..., list[checks.CheckMessage]]:
    """A check written as a generator, returning the list Django's checks return."""
    return functools.wraps(problems)(lambda **kwargs: list(problems(**kwargs)))


def _is_session_middleware(path: str) -> bool:
    """Django's SessionMiddleware, or a drop-in subclass of it (django-user-sessions')."""
    if path == SESSION_PATH:
        return True
    from django.contrib.sessions.middleware import SessionMiddleware

    try:
        middleware = import_string(path)
    except ImportError:
        return False  # Django's own check reports it
    return isinstance(middleware, type) and issubclass(middleware, SessionMiddleware)


@checks.register(checks.Tags.compatibility)
@_listed
def check_middleware(**kwargs: Any) -> Iterator[checks.CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if MIDDLEWARE_PATH not in middleware:
        yield checks.Warning(
            "IdempotencyMiddleware is not in MIDDLEWARE: plain Django views are not "
            "protected (DRF views decorated with @idempotent still are).",
            hint=f"Add {MIDDLEWARE_PATH!r} after AuthenticationMiddleware.",
            id="idempotency_django.W001",
        )
        return
    position = middleware.index(MIDDLEWARE_PATH)
    earlier = middleware[:position]
    if AUTHENTICATION_PATH in middleware and AUTHENTICATION_PATH not in earlier:
        yield checks.Error(
            f"IdempotencyMiddleware must come after {AUTHENTICATION_PATH}.",
            hint="Move it below, ideally to the end of MIDDLEWARE.",
            id="idempotency_django.E001",
        )
    anonymous = idempotency_settings.user_settings.get("ANONYMOUS")
    if anonymous == "session" and not any(_is_session_middleware(path) for path in earlier):
        yield checks.Error(
            "IDEMPOTENCY['ANONYMOUS'] is 'session', which needs SessionMiddleware "
            "before IdempotencyMiddleware.",
            hint=f"Add {SESSION_PATH!r} above it.",
            id="idempotency_django.E014",
        )
    if GZIP_PATH in middleware and GZIP_PATH not in earlier:
        yield checks.Warning(
            "GZipMiddleware comes after IdempotencyMiddleware: responses are stored "
            "compressed, and a retry is answered gzip-encoded whatever its "
            "Accept-Encoding says.",
            hint="Put GZipMiddleware before IdempotencyMiddleware (near the top, "
            "where Django recommends it), so each replay is compressed for its own request.",
            id="idempotency_django.W003",
        )
    # Under ASGI, a sync-only middleware after ours puts ours in sync mode too.
    sync_only = [path for path in middleware[position + 1 :] if _is_sync_only(path)]
    if sync_only:
        yield checks.Warning(
            f"{', '.join(sync_only)} can only run sync and comes after IdempotencyMiddleware. "
            "Under ASGI that makes IdempotencyMiddleware run sync, in a worker thread, "
            "where a client that hangs up cancels an async view mid-way: its key then "
            "stays reserved until LOCK_TIMEOUT instead of being answered with a replay.",
            hint="Move the sync-only middleware above IdempotencyMiddleware, or make it "
            "async-capable. Under WSGI this does not matter.",
            id="idempotency_django.W040",
        )


def _is_sync_only(path: str) -> bool:
    try:
        return not getattr(import_string(path), "async_capable", False)
    except ImportError:
        return False  # Django's own check reports it


@checks.register()
def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    user = getattr(settings, SETTING_NAME, {})
    if not isinstance(user, dict):
        return [_error(f"settings.{SETTING_NAME} must be a dict.", "E002")]
    merged = {**DEFAULTS, **user}
    messages = list(_setting_problems(user, merged))
    if any(message.level >= checks.ERROR for message in messages):
        return messages
    return messages + _check_store(merged)


def _setting_problems(
    user: dict[str, Any], merged: dict[str, Any]
) -> Iterator[checks.CheckMessage]:
    for name in user:
        if name in conf.REMOVED_SETTINGS:
            yield checks.Warning(
                f"{SETTING_NAME}[{name!r}] was removed in 0.3.0 and is not read; "
                f"its replacement: {conf.REMOVED_SETTINGS[name]}.",
                hint="docs/upgrading.md says how to move each removed setting.",
                id="idempotency_django.W050",
            )
        elif name not in DEFAULTS:
            yield _error(f"Unknown setting {SETTING_NAME}[{name!r}].", "E003")
    typed = {}
    for name, annotation in get_type_hints(conf.IdempotencySettings).items():
        refusal = None if name in OWN_CHECKS else _type_refusal(name, annotation, merged[name])
        if refusal is None:
            typed[name] = merged[name]
        else:
            yield _error(f"{SETTING_NAME}[{name!r}] {refusal[1]}", refusal[0])
    for name, code, rule in _out_of_bounds(typed):
        yield _error(f"{SETTING_NAME}[{name!r}] {rule}", code)
    methods = {str(method).upper() for method in typed.get("METHODS", ())}
    if not methods <= UNSAFE_METHODS:
        yield _error(
            f"{SETTING_NAME}['METHODS'] may only name unsafe methods; "
            f"{sorted(methods - UNSAFE_METHODS)} are safe or unknown.",
            "E007",
        )
    replayed = {str(h).lower() for h in typed.get("REPLAY_HEADERS", ())}
    forbidden = replayed & conf.FORBIDDEN_REPLAY_HEADERS
    if forbidden:
        yield _error(
            f"{SETTING_NAME}['REPLAY_HEADERS'] names {sorted(forbidden)}, which are never "
            "stored or replayed.",
            "E008",
        )
    for name in sorted(conf.IMPORT_STRINGS):
        if isinstance(merged[name], str):
            try:
                imported = import_string(merged[name])
            except ImportError as exc:
                yield _error(f"{SETTING_NAME}[{name!r}] cannot be imported: {exc}", "E009")
            else:
                if not callable(imported):  # a module, a constant: every request would fail
                    yield _error(
                        f"{SETTING_NAME}[{name!r}] names {type(imported).__name__} "
                        f"{merged[name]!r}, which cannot be called.",
                        "E004",
                    )
    if "REQUIRED_PATHS" in typed:
        yield from _check_required_paths(typed["REQUIRED_PATHS"])
    yield from _check_encryption_keys(merged["ENCRYPTION_KEY"], merged["ENCRYPTION_KEY_FALLBACKS"])


def _type_refusal(name: str, annotation: Any, value: Any) -> tuple[str, str] | None:
    """(E004, what it must be) for a value of another type than its annotation on
    ``IdempotencySettings``; E005 for a value that is not one of a ``Literal``'s."""
    if name in SHAPES:
        has_shape, shape = SHAPES[name]
        return None if has_shape(value) else ("E004", shape)
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        if value in choices and not isinstance(value, bool):
            return None
        return "E005", f"must be {' or '.join(map(repr, choices))}."
    union = get_origin(annotation) in (UnionType, Union)
    types = set(get_args(annotation)) if union else {annotation}
    if name in conf.IMPORT_STRINGS:
        if callable(value) or isinstance(value, str) or (value is None and NoneType in types):
            return None
        return "E004", "must be a dotted path or a function."
    if not types <= PLAIN_TYPES:
        return None
    if float in types:
        types.add(int)  # a number of seconds may be whole
    if isinstance(value, tuple(types)) and (bool in types or not isinstance(value, bool)):
        return None
    shown = " or ".join("None" if t is NoneType else t.__name__ for t in sorted(types, key=str))
    return "E004", f"must be of type {shown}, not {type(value).__name__}."


def _out_of_bounds(typed: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(setting, check id, what it must be) for the well-typed values out of their bounds."""
    lock_timeout = typed.get("LOCK_TIMEOUT", inf)
    for name in POSITIVE:
        value = typed.get(name)
        if value is None:
            continue
        if value <= 0:
            yield name, "E024", "must be above 0."
        elif name in EXPIRIES and value > MAX_SECONDS:
            yield name, "E025", f"must be at most {MAX_SECONDS} (100 years)."
    wait = typed.get("WAIT_FOR_IN_PROGRESS")
    if wait is not None and wait < 0:
        yield "WAIT_FOR_IN_PROGRESS", "E026", "must be 0 or more seconds."
    elif wait is not None and wait >= lock_timeout:
        yield "WAIT_FOR_IN_PROGRESS", "E027", "must be shorter than LOCK_TIMEOUT."
    if typed.get("HEARTBEAT") is not None:
        interval, max_run_time = conf.read_heartbeat(typed["HEARTBEAT"])
        if interval <= 0 or max_run_time <= 0:
            rule = "must renew every so many seconds above 0, up to a MAX_RUN_TIME above 0."
            yield "HEARTBEAT", "E024", rule
        elif max_run_time > MAX_SECONDS:
            yield "HEARTBEAT", "E025", f"MAX_RUN_TIME must be at most {MAX_SECONDS}."
        elif interval * 3 > lock_timeout:
            # Two renewals may be missed (a busy store, a pause) before a
            # running request loses its key.
            yield "HEARTBEAT", "E028", "must be at most a third of LOCK_TIMEOUT."


def _check_required_paths(patterns: list[str]) -> Iterator[checks.CheckMessage]:
    name = f"{SETTING_NAME}['REQUIRED_PATHS']"
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            yield _error(f"{name} has an invalid regular expression {pattern!r}: {exc}", "E013")
            return
    # Where the project has them, the admin's and the login page's paths.
    never_required = []
    with contextlib.suppress(NoReverseMatch, ImportError):
        never_required.append(("the admin", reverse("admin:index")))
    with contextlib.suppress(NoReverseMatch, ImportError):
        never_required.append(("the login page", resolve_url(settings.LOGIN_URL)))
    for where, path in never_required:
        matching = [pattern for pattern in patterns if re.match(pattern, path)]
        if matching:
            yield checks.Warning(
                f"{name} matches {where} ({path}) with {matching}: keys are never "
                f"required there, or nobody could log in.",
                hint="Narrow the pattern to the paths of your API, e.g. r'^/api/'.",
                id="idempotency_django.W002",
            )


def _check_encryption_keys(key: Any, fallbacks: Any) -> Iterator[checks.CheckMessage]:
    from idempotency_django.stores.encryption import invalid_keys

    problems = invalid_keys(key, fallbacks)
    for problem in problems:
        yield checks.Error(
            f"{problem}.",
            hint="A key is 32 URL-safe base64-encoded bytes, as "
            "idempotency_django.stores.encryption.generate_key() "
            "(Fernet.generate_key()) makes.",
            id="idempotency_django.E015",
        )
    if problems or not (key or fallbacks):
        return
    try:
        import cryptography.fernet  # noqa: F401
    except ImportError:
        yield checks.Error(
            f"{SETTING_NAME}['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS is set, but the "
            "cryptography package is not installed: every keyed request would answer "
            "503 idempotency_unavailable.",
            hint="pip install 'idempotency-django[encryption]'.",
            id="idempotency_django.E016",
        )


def _check_store(merged: dict[str, Any]) -> list[checks.CheckMessage]:
    try:
        import_string(conf.STORE_ALIASES.get(merged["STORE"], merged["STORE"]))
    except ImportError as exc:
        return [_error(f"{SETTING_NAME}['STORE'] cannot be imported: {exc}", "E009")]
    from idempotency_django.stores import get_store

    try:
        store = get_store()
    except Exception as exc:  # a store that cannot even be built
        return [_error(f"The idempotency store cannot be created: {exc}", "E011")]
    return store.check()


def _error(message: str, code: str) -> checks.CheckMessage:
    return checks.Error(message, id=f"idempotency_django.{code}")


@checks.register(checks.Tags.compatibility)
@_listed
def check_transactions(**kwargs: Any) -> Iterator[checks.CheckMessage]:
    """Configurations where the transaction's outcome overrides a setting, or cannot be one.

    It reads settings only, so it is not a ``database`` check (Django runs those
    only with ``check --database``).
    """
    atomic = [
        alias
        for alias, database in getattr(settings, "DATABASES", {}).items()
        if database.get("ATOMIC_REQUESTS")
    ]
    retain = idempotency_settings.user_settings.get("RETAIN_FUNCTION", DEFAULTS["RETAIN_FUNCTION"])
    keeps_client_errors = retain not in (DEFAULTS["RETAIN_FUNCTION"], retain_successes)
    if atomic and keeps_client_errors and "rest_framework" in settings.INSTALLED_APPS:
        yield checks.Warning(
            "RETAIN_FUNCTION keeps client errors, but DRF rolls back the "
            "ATOMIC_REQUESTS transaction of every 4xx raised as an APIException, and the "
            "reservation with it: those answers are released, not retained (what DRF "
            "rolled back did not happen, so a retry may run).",
            hint="Nothing to do if that is what you want; a 4xx a view returns "
            "without raising is retained.",
            id="idempotency_django.W041",
        )
    if len(atomic) > 1:
        yield checks.Warning(
            f"ATOMIC_REQUESTS is on for {len(atomic)} databases ({', '.join(atomic)}). "
            "Their commits are not one: when a later one fails, an earlier one has "
            "committed its part of the work.",
            hint="The response is stored only after every one has committed, and the "
            "key is released when IdempotencyMiddleware opened the transactions; "
            "for DRF and @idempotent views it stays reserved until LOCK_TIMEOUT.",
            id="idempotency_django.W042",
        )


@checks.register(checks.Tags.urls)
@_listed
def check_ninja_operations(**kwargs: Any) -> Iterator[checks.CheckMessage]:
    """django-ninja authenticates inside its views: the middleware cannot scope their keys.

    An unsafe operation without ``idempotency_django.ninja`` has its keys
    ignored (anonymous to the middleware), or scoped by a session cookie that
    rides along with someone else's token.
    """
    if importlib.util.find_spec("ninja") is None:
        return
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is Django's own check to report
        return
    methods = idempotency_settings.METHODS
    ninja_views = [(r, v) for r, v, _ in walk_patterns(patterns) if marks.is_ninja_view(v)]
    # The Django views' @idempotent on an operation: it finds no Django request where
    # ninja calls it, and every call is a 500.
    mistaken = sorted(
        {
            f"{route} ({', '.join(sorted(operation.methods))})"
            for route, view in ninja_views
            for operation in marks._ninja_operations(view)
            if getattr(getattr(operation, "view_func", None), marks.PROTECTED_ATTRIBUTE, False)
            and getattr(operation, marks.NINJA_OPTIONS_ATTRIBUTE, None) is None
            and set(getattr(operation, "methods", ())) & set(methods)
        }
    )
    if mistaken:
        yield checks.Error(
            f"{len(mistaken)} django-ninja operations carry the Django views' "
            f"@idempotent (idempotency_django.idempotent): {'; '.join(mistaken)}. "
            "Every request to them would fail (500).",
            hint="Use idempotency_django.ninja.idempotent on django-ninja operations "
            "(docs/ninja.md).",
            id="idempotency_django.E017",
        )
    routes = [
        f"{route} ({', '.join(sorted(unprotected))})"
        for route, view in ninja_views
        if (unprotected := marks.unprotected_ninja_methods(view, methods))
    ]
    routes = [route for route in routes if route not in mistaken]
    if routes:
        shown = "; ".join(routes[:5]) + (f"; and {len(routes) - 5} more" if routes[5:] else "")
        yield checks.Warning(
            f"django-ninja authenticates inside its views, and {len(routes)} of its routes "
            f"serve unsafe methods without idempotency_django.ninja: {shown}. "
            "Their Idempotency-Key is not used.",
            hint="Protect them with idempotency_django.ninja.idempotent (docs/ninja.md), "
            "or mark the operations @idempotency_exempt.",
            id="idempotency_django.W043",
        )
