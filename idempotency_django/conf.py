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
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

SETTING_NAME = "IDEMPOTENCY"

DEFAULTS: dict[str, Any] = {
    # False turns the protection off everywhere (e.g. in a test): keyed
    # requests then run as if they had no key.
    "ENABLED": True,
    # Where reservations and stored responses live: a short name or a dotted path.
    "STORE": "database",
    "STORE_OPTIONS": {},
    # Request headers.
    "HEADER": "Idempotency-Key",
    "LOCATION_HEADER": "X-Location-Id",
    # Which methods a key protects. Safe methods are never protected.
    "METHODS": ("POST", "PUT", "PATCH", "DELETE"),
    # Pluggable functions, by dotted path.
    "SCOPE_FUNCTION": "idempotency_django.protocol.scope.default_scope",
    "FINGERPRINT_FUNCTION": "idempotency_django.protocol.fingerprint.default_fingerprint",
    # Seconds before a reservation left by an unfinished request may be taken over.
    "LOCK_TIMEOUT": 300,
    # Seconds a completed response is kept and replayed.
    "RETENTION": 86400,
    # Seconds between renewals of running requests' reservations (one thread
    # per process), so that LOCK_TIMEOUT can be a few seconds: a crashed
    # request's key is free that soon. None: no renewal; LOCK_TIMEOUT must
    # outlast the slowest view. A dict also sets MAX_RUN_TIME, the seconds
    # after its claim that a reservation is no longer renewed (300 when a
    # number is given): {"INTERVAL": 10, "MAX_RUN_TIME": 600}.
    "HEARTBEAT": None,
    # Seconds a duplicate of a request still running waits for its answer
    # before 409 idempotency_key_in_progress. 0: answer 409 at once.
    "WAIT_FOR_IN_PROGRESS": 0,
    # Bytes: a larger response body is not kept (the record says so, and a
    # retry gets 409 idempotency_response_not_stored). None: no limit.
    "MAX_STORED_BODY": 1024 * 1024,
    # Live keys one principal may hold; a new key beyond it gets 429
    # idempotency_too_many_keys. None (no limit) by default: a number low enough
    # to stop a flood also refused ordinary integrations' writes for a day, and
    # counting costs a query per first request. Set it where anyone can sign up
    # for credentials, or where the Redis server may evict records.
    "MAX_KEYS_PER_PRINCIPAL": None,
    # Bytes: a keyed request with a larger body gets 413
    # idempotency_body_too_large before any of it is read. None: no limit.
    "MAX_FINGERPRINTED_BODY": 10 * 1024 * 1024,
    # Dotted path to a function(request, response, exception) -> bool that says
    # whether a 1xx-4xx answer is kept (a 5xx never is); exception: what DRF
    # or ninja turned into the response, else None. The default keeps 2xx/3xx
    # only, so a client can fix a 4xx request and retry with the same key;
    # "idempotency_django.protocol.retention.retain_client_errors" keeps 4xx
    # too, except 401, 403, 408, 409 and 429 (they may succeed later).
    "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_successes",
    # 400 idempotency_key_missing when a request carries no key, on the views
    # that opted in (@idempotent, DRF); never on the admin or auth views.
    "REQUIRED": False,
    # Regular expressions matched against request.path_info (e.g. r"^/api/"):
    # the plain views there need a key too; never the admin or auth views.
    "REQUIRED_PATHS": (),
    # Run the view and store its response in one transaction (exactly once).
    "ATOMIC": False,
    # Status for a key reused with a different request: 409 (Conflict, the
    # default) or 422 (as the IETF draft suggests).
    "REUSE_STATUS": 409,
    # Retry-After seconds sent with 409 in progress, 429 and 503 unavailable.
    "RETRY_AFTER": 1,
    # What happens to a keyed request that has no principal: "ignore" runs it
    # unprotected (never stored, never replayed); "reject" answers 401.
    "ANONYMOUS": "ignore",
    # Response headers copied into the stored response and replayed.
    "REPLAY_HEADERS": (
        "Content-Type",
        # A compressed body is stored compressed (GZipMiddleware listed after
        # IdempotencyMiddleware): it must be replayed with its encoding.
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
    # A Fernet key (idempotency_django.stores.encryption.generate_key()) that encrypts stored
    # headers and bodies at rest (needs cryptography). None: stored as they are.
    "ENCRYPTION_KEY": None,
    # Older keys that still decrypt what they encrypted, as SECRET_KEY_FALLBACKS: for
    # a rotation, or to turn encryption off while encrypted records are still live.
    "ENCRYPTION_KEY_FALLBACKS": (),
    # -- How answers look -------------------------------------------------
    # The response headers that tell a client what became of its key; a dict
    # given here changes only the names it has. REPLAYED marks a replay
    # ("Idempotent-Replayed" for Stripe's clients); KEY_IGNORED says the key
    # was not used, with the reason ("anonymous" or "unprotected"); KEY_ECHO
    # echoes the request's key (e.g. "Idempotency-Key"). None: not sent
    # (REPLAYED is always sent).
    "MARKER_HEADERS": {
        "REPLAYED": "Idempotency-Replayed",
        "KEY_IGNORED": "Idempotency-Key-Ignored",
        "KEY_ECHO": None,
    },
    # Dotted path to a function(request, members, headers) -> HttpResponse
    # (a problem "type" URI of the project's own is set there: docs/errors.md).
    "PROBLEM_RENDERER": "idempotency_django.protocol.problems.render_problem",
    # Dotted path to a function(request, response) -> HttpResponse called with
    # every replay: it may add headers, or answer something else instead.
    "REPLAY_HOOK": None,
    # Request header whose value is logged as request_id and kept on the
    # record: set it when a trusted proxy sets the header. None: no request id.
    "REQUEST_ID_HEADER": None,
    # -- Webhook delivery deduplication (a separate contract) --------------
    # The one header that carries a sender's delivery id, for receivers that
    # name none themselves (e.g. "webhook-id"). None: no header counts.
    "WEBHOOK_ID_HEADER": None,
    # Dotted path to a function(request) -> str | None reading an id from the
    # body, e.g. "idempotency_django.webhooks.stripe_event_id", for receivers
    # that name no id and when WEBHOOK_ID_HEADER is None. None: no body id.
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

IMPORT_STRINGS = frozenset(
    {
        "SCOPE_FUNCTION",
        "FINGERPRINT_FUNCTION",
        "WEBHOOK_BODY_ID_FUNCTION",
        "PROBLEM_RENDERER",
        "REPLAY_HOOK",
        "RETAIN_FUNCTION",
    }
)


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


def read_heartbeat(value: float | dict[str, Any]) -> HeartbeatSetting:
    """``HEARTBEAT`` as a number of seconds, or as a dict that sets MAX_RUN_TIME too."""
    if isinstance(value, dict):
        max_run_time = value.get("MAX_RUN_TIME", DEFAULT_MAX_RUN_TIME)
        return HeartbeatSetting(value["INTERVAL"], max_run_time)
    return HeartbeatSetting(value, DEFAULT_MAX_RUN_TIME)


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        idempotency_settings.reload()


setting_changed.connect(_reload)
