"""The ``IDEMPOTENCY`` settings namespace, read through one accessor.

Like DRF's ``api_settings``: user values override :data:`DEFAULTS`, dotted
paths are imported lazily, and everything is recomputed when a test changes
the setting with ``override_settings``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

SETTING_NAME = "IDEMPOTENCY"

#: Each is documented in docs/settings.md; the comments say only what a value means.
DEFAULTS: dict[str, Any] = {
    # False: keyed requests run as if they had no key.
    "ENABLED": True,
    # "database", "redis", "memory" or a dotted path (STORE_ALIASES).
    "STORE": "database",
    "STORE_OPTIONS": {},
    "HEADER": "Idempotency-Key",
    "LOCATION_HEADER": "X-Location-Id",
    # The methods a key protects; safe methods never are.
    "METHODS": ("POST", "PUT", "PATCH", "DELETE"),
    "SCOPE_FUNCTION": "idempotency_django.protocol.scope.default_scope",
    "FINGERPRINT_FUNCTION": "idempotency_django.protocol.fingerprint.default_fingerprint",
    # Seconds before an unfinished request's reservation may be taken over.
    "LOCK_TIMEOUT": 300,
    # Seconds a completed response is kept and replayed.
    "RETENTION": 86400,
    # None: no renewal. Seconds between renewals, or {"INTERVAL": ..., "MAX_RUN_TIME": ...}.
    "HEARTBEAT": None,
    # Seconds a duplicate of a running request waits before its 409; 0: none.
    "WAIT_FOR_IN_PROGRESS": 0,
    # Bytes; a larger response is not kept (409 idempotency_response_not_stored). None: no limit.
    "MAX_STORED_BODY": 1024 * 1024,
    # Live keys per principal (429 idempotency_too_many_keys past it). None: no limit,
    # because a count low enough to stop a flood refuses ordinary integrations too.
    "MAX_KEYS_PER_PRINCIPAL": None,
    # Bytes; a larger keyed request body gets 413 before any of it is read. None: no limit.
    "MAX_FINGERPRINTED_BODY": 10 * 1024 * 1024,
    # function(request, response, exception) -> bool: keep a 1xx-4xx answer? (5xx never.)
    "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_successes",
    # 400 idempotency_key_missing without a key, on the views that opted in.
    "REQUIRED": False,
    # Regular expressions on request.path_info whose plain views need a key too.
    "REQUIRED_PATHS": (),
    # The view and its stored response in one transaction.
    "ATOMIC": False,
    # 409 or 422 for a key reused with a different request.
    "REUSE_STATUS": 409,
    # Retry-After seconds of 409 in progress, 429 and 503.
    "RETRY_AFTER": 1,
    # A keyed request without a principal: "ignore" (unprotected), "reject" (401) or "session".
    "ANONYMOUS": "ignore",
    # Response headers stored and replayed (never FORBIDDEN_REPLAY_HEADERS).
    "REPLAY_HEADERS": (
        "Content-Type",
        # A body compressed after this middleware is stored compressed.
        "Content-Encoding",
        "Content-Language",
        "Content-Location",
        "Location",
        "ETag",
        "Last-Modified",
        "Link",
        "Cache-Control",
        "Expires",
        "Vary",
    ),
    # A Fernet key encrypting stored headers and bodies; None: stored as they are.
    "ENCRYPTION_KEY": None,
    # Older keys that still decrypt, as SECRET_KEY_FALLBACKS.
    "ENCRYPTION_KEY_FALLBACKS": (),
    # The names of the headers telling a client what became of its key; a dict given
    # changes only the names it has. None: not sent (REPLAYED always is).
    "MARKER_HEADERS": {
        "REPLAYED": "Idempotency-Replayed",
        "KEY_IGNORED": "Idempotency-Key-Ignored",
        "KEY_ECHO": None,
    },
    # function(request, members, headers) -> HttpResponse.
    "PROBLEM_RENDERER": "idempotency_django.protocol.problems.render_problem",
    # function(request, response) -> HttpResponse, called with every replay.
    "REPLAY_HOOK": None,
    # A trusted request header logged as request_id and kept on the record.
    "REQUEST_ID_HEADER": None,
    # -- Webhook delivery deduplication (a separate contract) --------------
    # The header carrying a delivery id, for receivers that name none.
    "WEBHOOK_ID_HEADER": None,
    # function(request) -> str | None reading a delivery id from the body.
    "WEBHOOK_BODY_ID_FUNCTION": None,
    # Seconds an accepted delivery's identity is kept (7 days).
    "WEBHOOK_RETENTION": 7 * 24 * 3600,
}

#: Settings of 0.2.0 that are no longer read, and what replaces each: the
#: check W050 names the replacement to a project that still sets one.
REMOVED_SETTINGS = {
    "MAX_WAITERS_PER_KEY": "nothing: one duplicate per key may wait, two per process",
    "MAX_WAITERS": "nothing: one duplicate per key may wait, two per process",
    "UNAVAILABLE_RETRY_AFTER": "RETRY_AFTER, which 503 idempotency_unavailable now sends too",
    "RETAIN_CLIENT_ERRORS": "RETAIN_FUNCTION = "
    "'idempotency_django.protocol.retention.retain_client_errors' (for True)",
    "MAX_RUN_TIME": "HEARTBEAT = {'INTERVAL': ..., 'MAX_RUN_TIME': ...}",
    "REPLAYED_HEADER": "MARKER_HEADERS = {'REPLAYED': ...}",
    "IGNORED_KEY_HEADER": "MARKER_HEADERS = {'KEY_IGNORED': ...}",
    "ECHO_KEY_HEADER": "MARKER_HEADERS = {'KEY_ECHO': ...}",
    "PROBLEM_TYPE_BASE": "a PROBLEM_RENDERER that sets members['type'] (docs/errors.md)",
    "DRF_EXCEPTION_HANDLER": "raise_idempotency_errors = True on the DRF view (IdempotentMixin)",
    "WEBHOOK_FALLBACK_BUCKET": "nothing: the fallback hash's bucket is 300 seconds",
    "WEBHOOK_TOKEN_KWARG": "nothing: every URL keyword argument of a receiver counts",
    "TASK_DUPLICATES": "duplicates='skip' on the task (@idempotent_task, the queue decorators)",
}

#: Never stored or replayed, whatever REPLAY_HEADERS says.
FORBIDDEN_REPLAY_HEADERS = frozenset(
    {"set-cookie", "authorization", "proxy-authorization", "cookie", "www-authenticate"}
)

STORE_ALIASES = {
    "database": "idempotency_django.stores.database.DatabaseStore",
    "redis": "idempotency_django.stores.redis.RedisStore",
    # One process only, for tests and benchmarks: check E023 refuses it elsewhere.
    "memory": "idempotency_django.stores.memory.MemoryStore",
}


class HeartbeatSetting(NamedTuple):
    """``HEARTBEAT`` as read: seconds between renewals, and until the last one."""

    interval: float
    max_run_time: int


class MarkerHeaders(NamedTuple):
    """``MARKER_HEADERS`` as read: each header's name; None: the header is not sent."""

    replayed: str
    key_ignored: str | None
    key_echo: str | None


#: Read when HEARTBEAT is a number, or a dict without MAX_RUN_TIME.
DEFAULT_MAX_RUN_TIME = 300


class IdempotencySettings:
    """Attribute access to the merged settings; imports dotted paths on first use.

    Each setting is declared here with the type a read gives (a dotted path
    reads as the function it names, METHODS as a frozenset, REQUIRED_PATHS
    compiled), so that nothing reading it casts. The values are in
    :data:`DEFAULTS`; the checks refuse a value of another type.
    """

    ENABLED: bool
    STORE: str
    STORE_OPTIONS: dict[str, Any]
    HEADER: str
    LOCATION_HEADER: str
    METHODS: frozenset[str]
    #: Returns a ``scope.Scope`` or None (scope.py reads these settings: not imported here).
    SCOPE_FUNCTION: Callable[[HttpRequest], Any]
    FINGERPRINT_FUNCTION: Callable[[HttpRequest], str]
    LOCK_TIMEOUT: int
    RETENTION: int
    HEARTBEAT: HeartbeatSetting | None
    WAIT_FOR_IN_PROGRESS: float
    MAX_STORED_BODY: int | None
    MAX_KEYS_PER_PRINCIPAL: int | None
    MAX_FINGERPRINTED_BODY: int | None
    RETAIN_FUNCTION: Callable[[Any, Any, Any], bool]
    REQUIRED: bool
    REQUIRED_PATHS: tuple[re.Pattern[str], ...]
    ATOMIC: bool
    REUSE_STATUS: Literal[409, 422]
    RETRY_AFTER: int
    ANONYMOUS: Literal["ignore", "reject", "session"]
    REPLAY_HEADERS: frozenset[str]
    ENCRYPTION_KEY: str | bytes | None
    ENCRYPTION_KEY_FALLBACKS: Sequence[str | bytes]
    MARKER_HEADERS: MarkerHeaders
    PROBLEM_RENDERER: Callable[[HttpRequest | None, dict[str, Any], dict[str, str]], HttpResponse]
    REPLAY_HOOK: Callable[[HttpRequest, HttpResponse], HttpResponse] | None
    REQUEST_ID_HEADER: str | None
    WEBHOOK_ID_HEADER: str | None
    WEBHOOK_BODY_ID_FUNCTION: Callable[[HttpRequest], str | None] | None
    WEBHOOK_RETENTION: int

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, SETTING_NAME, {})
        return value if isinstance(value, dict) else {}

    # Hidden from type checkers, so that a misspelt setting is an error there.
    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # Only reached on a first access: the value is then kept as an
            # instance attribute, so later reads cost a plain attribute lookup.
            if name.startswith("_") or name not in DEFAULTS:
                raise AttributeError(f"Invalid idempotency setting: {name!r}")
            value = self.user_settings.get(name, DEFAULTS[name])
            if name in IMPORT_STRINGS and isinstance(value, str):
                value = import_string(value)
            elif name in {"METHODS", "REPLAY_HEADERS"}:
                value = frozenset(str(item).upper() for item in value)
            elif name == "REQUIRED_PATHS":
                value = tuple(re.compile(pattern) for pattern in value)
            elif name == "HEARTBEAT" and value is not None:
                value = read_heartbeat(value)
            elif name == "MARKER_HEADERS":
                names = {**DEFAULTS["MARKER_HEADERS"], **value}
                value = MarkerHeaders(*(names[field.upper()] for field in MarkerHeaders._fields))
            setattr(self, name, value)
            return value

    def reload(self) -> None:
        for name in DEFAULTS:
            self.__dict__.pop(name, None)


idempotency_settings = IdempotencySettings()

#: The settings given as dotted paths: those whose read is a function.
IMPORT_STRINGS = frozenset(
    name for name, kind in IdempotencySettings.__annotations__.items() if "Callable" in kind
)


def read_heartbeat(value: float | dict[str, Any]) -> HeartbeatSetting:
    """``HEARTBEAT`` as a number of seconds, or as a dict that sets MAX_RUN_TIME too."""
    if not isinstance(value, dict):
        value = {"INTERVAL": value}
    return HeartbeatSetting(value["INTERVAL"], value.get("MAX_RUN_TIME", DEFAULT_MAX_RUN_TIME))


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        idempotency_settings.reload()
