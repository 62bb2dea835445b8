"""System checks: the middleware's place, the settings' values, the store's configuration."""

from __future__ import annotations

import contextlib
import importlib.util
import re
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from django.conf import settings
from django.core import checks
from django.shortcuts import resolve_url
from django.urls import NoReverseMatch, get_resolver, reverse
from django.utils.module_loading import import_string

from idempotency_django.conf import (
    DEFAULT_MAX_RUN_TIME,
    DEFAULTS,
    FORBIDDEN_REPLAY_HEADERS,
    IMPORT_STRINGS,
    REMOVED_SETTINGS,
    SETTING_NAME,
    STORE_ALIASES,
    IdempotencySettings,
    idempotency_settings,
    read_heartbeat,
)
from idempotency_django.protocol.marks import (
    NINJA_OPTIONS_ATTRIBUTE,
    PROTECTED_ATTRIBUTE,
    _ninja_operations,
    is_ninja_view,
    unprotected_ninja_methods,
)
from idempotency_django.protocol.options import MAX_SECONDS
from idempotency_django.protocol.retention import retain_successes
from idempotency_django.protocol.routes import walk_patterns

MIDDLEWARE_PATH = "idempotency_django.middleware.IdempotencyMiddleware"
#: Middleware that must run before ours: it sets request.user, which scopes keys.
MUST_PRECEDE = ("django.contrib.auth.middleware.AuthenticationMiddleware",)
GZIP_PATH = "django.middleware.gzip.GZipMiddleware"
SESSION_PATH = "django.contrib.sessions.middleware.SessionMiddleware"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
#: Numbers that must be above 0 (None, where the type allows it, is "no limit").
POSITIVE = (
    "LOCK_TIMEOUT",
    "RETENTION",
    "RETRY_AFTER",
    "WEBHOOK_RETENTION",
    "MAX_STORED_BODY",
    "MAX_KEYS_PER_PRINCIPAL",
    "MAX_FINGERPRINTED_BODY",
)
#: Seconds that become a record's expiry: at most MAX_SECONDS, which the stores can write.
EXPIRIES = ("LOCK_TIMEOUT", "RETENTION", "WEBHOOK_RETENTION")
#: The plain types a setting's annotation may be made of; the others are checked one by one.
PLAIN_TYPES = {bool, int, float, str, bytes, type(None)}
#: Settings whose every condition a check of their own reports (E015: the keys).
OWN_CHECKS = {"ENCRYPTION_KEY"}


@checks.register(checks.Tags.compatibility)
def check_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if MIDDLEWARE_PATH not in middleware:
        return [
            checks.Warning(
                "IdempotencyMiddleware is not in MIDDLEWARE: plain Django views are not "
                "protected (DRF views decorated with @idempotent still are).",
                hint=f"Add {MIDDLEWARE_PATH!r} after AuthenticationMiddleware.",
                id="idempotency_django.W001",
            )
        ]
    position = middleware.index(MIDDLEWARE_PATH)
    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"IdempotencyMiddleware must come after {name}.",
            hint="Move it below, ideally to the end of MIDDLEWARE.",
            id="idempotency_django.E001",
        )
        for name in MUST_PRECEDE
        if name in middleware and middleware.index(name) > position
    ]
    anonymous = idempotency_settings.user_settings.get("ANONYMOUS")
    if anonymous == "session" and (
        SESSION_PATH not in middleware or middleware.index(SESSION_PATH) > position
    ):
        messages.append(
            checks.Error(
                "IDEMPOTENCY['ANONYMOUS'] is 'session', which needs SessionMiddleware "
                "before IdempotencyMiddleware.",
                hint=f"Add {SESSION_PATH!r} above it.",
                id="idempotency_django.E014",
            )
        )
    if GZIP_PATH in middleware and middleware.index(GZIP_PATH) > position:
        messages.append(
            checks.Warning(
                "GZipMiddleware comes after IdempotencyMiddleware: responses are stored "
                "compressed, and a retry is answered gzip-encoded whatever its "
                "Accept-Encoding says.",
                hint="Put GZipMiddleware before IdempotencyMiddleware (near the top, "
                "where Django recommends it), so each replay is compressed for its own request.",
                id="idempotency_django.W003",
            )
        )
    messages.extend(_sync_only_after(middleware[position + 1 :]))
    return messages


def _sync_only_after(later: list[str]) -> list[checks.CheckMessage]:
    """Under ASGI, a sync-only middleware after ours puts ours in sync mode too."""
    sync_only = []
    for path in later:
        try:
            middleware = import_string(path)
        except ImportError:
            continue  # Django's own check reports it
        if not getattr(middleware, "async_capable", False):
            sync_only.append(path)
    if not sync_only:
        return []
    return [
        checks.Warning(
            f"{', '.join(sync_only)} can only run sync and comes after IdempotencyMiddleware. "
            "Under ASGI that makes IdempotencyMiddleware run sync, in a worker thread, "
            "where a client that hangs up cancels an async view mid-way: its key then "
            "stays reserved until LOCK_TIMEOUT instead of being answered with a replay.",
            hint="Move the sync-only middleware above IdempotencyMiddleware, or make it "
            "async-capable. Under WSGI this does not matter.",
            id="idempotency_django.W040",
        )
    ]


@checks.register()
def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    user = getattr(settings, SETTING_NAME, {})
    if not isinstance(user, dict):
        return [_error(f"settings.{SETTING_NAME} must be a dict.", "E002")]
    messages: list[checks.CheckMessage] = [
        checks.Warning(
            f"{SETTING_NAME}[{name!r}] was removed in 0.3.0 and is not read; "
            f"its replacement: {REMOVED_SETTINGS[name]}.",
            hint="docs/upgrading.md says how to move each removed setting.",
            id="idempotency_django.W050",
        )
        for name in user
        if name in REMOVED_SETTINGS
    ]
    messages += [
        _error(f"Unknown setting {SETTING_NAME}[{name!r}].", "E003")
        for name in user
        if name not in DEFAULTS and name not in REMOVED_SETTINGS
    ]
    merged = {**DEFAULTS, **user}
    type_errors = _check_types(merged)
    range_errors = _check_ranges({n: v for n, v in merged.items() if n not in type_errors})
    for found in (type_errors, range_errors):
        messages += [error for errors_of_one in found.values() for error in errors_of_one]
    methods = {str(method).upper() for method in merged["METHODS"]}
    if not methods <= UNSAFE_METHODS:
        messages.append(
            _error(
                f"{SETTING_NAME}['METHODS'] may only name unsafe methods; "
                f"{sorted(methods - UNSAFE_METHODS)} are safe or unknown.",
                "E007",
            )
        )
    forbidden = {str(h).lower() for h in merged["REPLAY_HEADERS"]} & FORBIDDEN_REPLAY_HEADERS
    if forbidden:
        messages.append(
            _error(
                f"{SETTING_NAME}['REPLAY_HEADERS'] names {sorted(forbidden)}, which are never "
                "stored or replayed.",
                "E008",
            )
        )
    for name in sorted(IMPORT_STRINGS):
        value = merged[name]
        if isinstance(value, str):
            try:
                import_string(value)
            except ImportError as exc:
                messages.append(
                    _error(f"{SETTING_NAME}[{name!r}] cannot be imported: {exc}", "E009")
                )
    messages.extend(_check_required_paths(merged["REQUIRED_PATHS"]))
    messages.extend(
        _check_encryption_keys(merged["ENCRYPTION_KEY"], merged["ENCRYPTION_KEY_FALLBACKS"])
    )
    if any(message.level >= checks.ERROR for message in messages):
        return messages
    return messages + _check_store(merged)


def _check_types(merged: dict[str, Any]) -> dict[str, list[checks.CheckMessage]]:
    """E004 for a value of another type than its annotation on ``IdempotencySettings``.

    E005 for a value that is not one of a ``Literal``'s. Only annotations made of
    plain types are read here; the dicts have their own rules below.
    """
    errors: dict[str, list[checks.CheckMessage]] = {}
    for name, annotation in get_type_hints(IdempotencySettings).items():
        if name not in merged or name in OWN_CHECKS:
            continue
        value = merged[name]
        if get_origin(annotation) is Literal:
            choices = get_args(annotation)
            if value not in choices or isinstance(value, bool):
                shown = " or ".join(repr(choice) for choice in choices)
                message = f"{SETTING_NAME}[{name!r}] must be {shown}."
                errors[name] = [_error(message, "E005")]
            continue
        union = get_origin(annotation) in (UnionType, Union)
        types = set(get_args(annotation)) if union else {annotation}
        if name in IMPORT_STRINGS:
            optional = value is None and type(None) in types
            if not (optional or callable(value) or isinstance(value, str)):
                message = f"{SETTING_NAME}[{name!r}] must be a dotted path or a function."
                errors[name] = [_error(message, "E004")]
            continue
        if not types <= PLAIN_TYPES:
            continue
        if float in types:
            types.add(int)  # a number of seconds may be whole
        if not isinstance(value, tuple(types)) or (isinstance(value, bool) and bool not in types):
            shown = " or ".join(
                "None" if t is type(None) else t.__name__ for t in sorted(types, key=str)
            )
            message = (
                f"{SETTING_NAME}[{name!r}] must be of type {shown}, not {type(value).__name__}."
            )
            errors[name] = [_error(message, "E004")]
    heartbeat = _check_heartbeat_type(merged["HEARTBEAT"])
    if heartbeat:
        errors["HEARTBEAT"] = heartbeat
    markers = merged["MARKER_HEADERS"]
    if (
        not isinstance(markers, dict)
        or not set(markers) <= set(DEFAULTS["MARKER_HEADERS"])
        or not all(value is None or isinstance(value, str) for value in markers.values())
        or not markers.get("REPLAYED", "x")
    ):
        message = (
            f"{SETTING_NAME}['MARKER_HEADERS'] must be a dict of REPLAYED (a header name), "
            "KEY_IGNORED and KEY_ECHO (a header name, or None)."
        )
        errors["MARKER_HEADERS"] = [_error(message, "E004")]
    return errors


def _check_heartbeat_type(heartbeat: Any) -> list[checks.CheckMessage]:
    if heartbeat is None or _is_number(heartbeat):
        return []
    if (
        isinstance(heartbeat, dict)
        and "INTERVAL" in heartbeat
        and set(heartbeat) <= {"INTERVAL", "MAX_RUN_TIME"}
        and _is_number(heartbeat["INTERVAL"])
        and _is_number(heartbeat.get("MAX_RUN_TIME", DEFAULT_MAX_RUN_TIME), int)
    ):
        return []
    message = (
        f"{SETTING_NAME}['HEARTBEAT'] must be None, a number of seconds, or a dict of "
        "INTERVAL (seconds) and MAX_RUN_TIME (whole seconds)."
    )
    return [_error(message, "E004")]


def _check_ranges(typed: dict[str, Any]) -> dict[str, list[checks.CheckMessage]]:
    """The bounds of the settings whose type is right: ``typed`` holds only those."""
    errors: dict[str, list[checks.CheckMessage]] = {}

    def refuse(name: str, message: str, code: str) -> None:
        errors.setdefault(name, []).append(_error(f"{SETTING_NAME}[{name!r}] {message}", code))

    for name in POSITIVE:
        value = typed.get(name)
        if value is not None and value <= 0:
            refuse(name, "must be above 0.", "E024")
        elif name in EXPIRIES and value is not None and value > MAX_SECONDS:
            refuse(name, f"must be at most {MAX_SECONDS} (100 years).", "E025")
    lock_timeout = typed.get("LOCK_TIMEOUT")
    wait = typed.get("WAIT_FOR_IN_PROGRESS")
    if wait is not None and wait < 0:
        refuse("WAIT_FOR_IN_PROGRESS", "must be 0 or more seconds.", "E026")
    elif wait is not None and lock_timeout is not None and wait >= lock_timeout:
        refuse("WAIT_FOR_IN_PROGRESS", "must be shorter than LOCK_TIMEOUT.", "E027")
    if typed.get("HEARTBEAT") is not None:
        heartbeat = read_heartbeat(typed["HEARTBEAT"])
        if heartbeat.interval <= 0 or heartbeat.max_run_time <= 0:
            refuse(
                "HEARTBEAT",
                "must renew every so many seconds above 0, up to a MAX_RUN_TIME above 0.",
                "E024",
            )
        elif heartbeat.max_run_time > MAX_SECONDS:
            refuse("HEARTBEAT", f"MAX_RUN_TIME must be at most {MAX_SECONDS}.", "E025")
        elif lock_timeout is not None and heartbeat.interval * 3 > lock_timeout:
            # Two renewals may be missed (a busy store, a pause) before a
            # running request loses its key.
            refuse("HEARTBEAT", "must be at most a third of LOCK_TIMEOUT.", "E028")
    return errors


def _check_required_paths(patterns: Any) -> list[checks.CheckMessage]:
    name = f"{SETTING_NAME}['REQUIRED_PATHS']"
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        return [_error(f"{name} must be a list of regular expressions (strings).", "E004")]
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            return [_error(f"{name} has an invalid regular expression {pattern!r}: {exc}", "E013")]
    messages: list[checks.CheckMessage] = []
    for where, path in _never_required_paths():
        matching = [p.pattern for p in compiled if p.match(path)]
        if matching:
            messages.append(
                checks.Warning(
                    f"{name} matches {where} ({path}) with {matching}: keys are never "
                    f"required there, or nobody could log in.",
                    hint="Narrow the pattern to the paths of your API, e.g. r'^/api/'.",
                    id="idempotency_django.W002",
                )
            )
    return messages


def _check_encryption_keys(key: Any, fallbacks: Any) -> list[checks.CheckMessage]:
    from idempotency_django.stores.encryption import invalid_keys

    problems = invalid_keys(key, fallbacks)
    if problems:
        return [
            checks.Error(
                f"{problem}.",
                hint="A key is 32 URL-safe base64-encoded bytes, as "
                "idempotency_django.stores.encryption.generate_key() "
                "(Fernet.generate_key()) makes.",
                id="idempotency_django.E015",
            )
            for problem in problems
        ]
    if not key and not fallbacks:
        return []
    try:
        import cryptography.fernet  # noqa: F401
    except ImportError:
        return [
            checks.Error(
                f"{SETTING_NAME}['ENCRYPTION_KEY'] or ENCRYPTION_KEY_FALLBACKS is set, but the "
                "cryptography package is not installed: every keyed request would answer "
                "503 idempotency_unavailable.",
                hint="pip install 'idempotency-django[encryption]'.",
                id="idempotency_django.E016",
            )
        ]
    return []


def _never_required_paths() -> list[tuple[str, str]]:
    """The admin's and the login page's paths, where the project has them."""
    paths = []
    with contextlib.suppress(NoReverseMatch, ImportError):
        paths.append(("the admin", reverse("admin:index")))
    with contextlib.suppress(NoReverseMatch, ImportError):
        paths.append(("the login page", resolve_url(settings.LOGIN_URL)))
    return paths


def _check_store(merged: dict[str, Any]) -> list[checks.CheckMessage]:
    path = STORE_ALIASES.get(merged["STORE"], merged["STORE"])
    try:
        import_string(path)
    except ImportError as exc:
        return [_error(f"{SETTING_NAME}['STORE'] cannot be imported: {exc}", "E009")]
    from idempotency_django.stores import get_store

    try:
        store = get_store()
    except Exception as exc:  # a store that cannot even be built
        return [_error(f"The idempotency store cannot be created: {exc}", "E011")]
    return store.check()


def _is_number(value: Any, types: type | tuple[type, ...] = (int, float)) -> bool:
    """Whether ``value`` is one of ``types``, and not a bool (which is an int to Python)."""
    return isinstance(value, types) and not isinstance(value, bool)


def _error(message: str, code: str) -> checks.CheckMessage:
    return checks.Error(message, id=f"idempotency_django.{code}")


@checks.register(checks.Tags.compatibility)
def check_transactions(**kwargs: Any) -> list[checks.CheckMessage]:
    """Configurations where the transaction's outcome overrides a setting, or cannot be one.

    It reads settings only, so it is not a ``database`` check (Django runs those
    only with ``check --database``).
    """
    atomic = [
        alias
        for alias, database in getattr(settings, "DATABASES", {}).items()
        if database.get("ATOMIC_REQUESTS")
    ]
    user = idempotency_settings.user_settings
    retain = user.get("RETAIN_FUNCTION", DEFAULTS["RETAIN_FUNCTION"]) not in (
        DEFAULTS["RETAIN_FUNCTION"],
        retain_successes,
    )
    messages: list[checks.CheckMessage] = []
    if atomic and retain and "rest_framework" in getattr(settings, "INSTALLED_APPS", ()):
        messages.append(
            checks.Warning(
                "RETAIN_FUNCTION keeps client errors, but DRF rolls back the "
                "ATOMIC_REQUESTS transaction of every 4xx raised as an APIException, and the "
                "reservation with it: those answers are released, not retained (what DRF "
                "rolled back did not happen, so a retry may run).",
                hint="Nothing to do if that is what you want; a 4xx a view returns "
                "without raising is retained.",
                id="idempotency_django.W041",
            )
        )
    if len(atomic) > 1:
        messages.append(
            checks.Warning(
                f"ATOMIC_REQUESTS is on for {len(atomic)} databases ({', '.join(atomic)}). "
                "Their commits are not one: when a later one fails, an earlier one has "
                "committed its part of the work.",
                hint="The response is stored only after every one has committed, and the "
                "key is released when IdempotencyMiddleware opened the transactions; "
                "for DRF and @idempotent views it stays reserved until LOCK_TIMEOUT.",
                id="idempotency_django.W042",
            )
        )
    return messages


@checks.register(checks.Tags.urls)
def check_ninja_operations(**kwargs: Any) -> list[checks.CheckMessage]:
    """django-ninja authenticates inside its views: the middleware cannot scope their keys.

    An unsafe operation without ``idempotency_django.ninja`` has its keys
    ignored (anonymous to the middleware), or scoped by a session cookie that
    rides along with someone else's token.
    """
    if importlib.util.find_spec("ninja") is None:
        return []
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is Django's own check to report
        return []
    methods = idempotency_settings.METHODS
    ninja_views = [(r, v) for r, v, _ in walk_patterns(patterns) if is_ninja_view(v)]
    # The Django views' @idempotent on an operation: it finds no Django request where
    # ninja calls it, and every call is a 500.
    mistaken = sorted(
        {
            f"{route} ({', '.join(sorted(operation.methods))})"
            for route, view in ninja_views
            for operation in _ninja_operations(view)
            if getattr(getattr(operation, "view_func", None), PROTECTED_ATTRIBUTE, False)
            and getattr(operation, NINJA_OPTIONS_ATTRIBUTE, None) is None
            and set(getattr(operation, "methods", ())) & set(methods)
        }
    )
    messages: list[checks.CheckMessage] = []
    if mistaken:
        messages.append(
            checks.Error(
                f"{len(mistaken)} django-ninja operations carry the Django views' "
                f"@idempotent (idempotency_django.idempotent): {'; '.join(mistaken)}. "
                "Every request to them would fail (500).",
                hint="Use idempotency_django.ninja.idempotent on django-ninja operations "
                "(docs/ninja.md).",
                id="idempotency_django.E017",
            )
        )
    routes = [
        f"{route} ({', '.join(sorted(unprotected))})"
        for route, view in ninja_views
        if (unprotected := unprotected_ninja_methods(view, methods))
        and f"{route} ({', '.join(sorted(unprotected))})" not in mistaken
    ]
    if not routes:
        return messages
    shown = "; ".join(routes[:5]) + (f"; and {len(routes) - 5} more" if len(routes) > 5 else "")
    return [
        *messages,
        checks.Warning(
            f"django-ninja authenticates inside its views, and {len(routes)} of its routes "
            f"serve unsafe methods without idempotency_django.ninja: {shown}. "
            "Their Idempotency-Key is not used.",
            hint="Protect them with idempotency_django.ninja.idempotent (docs/ninja.md), "
            "or mark the operations @idempotency_exempt.",
            id="idempotency_django.W043",
        ),
    ]
