"""The ``IDEMPOTENCY`` settings namespace, read through one accessor.

Like DRF's ``api_settings``: user values override :data:`DEFAULTS`, dotted
paths are imported lazily, and everything is recomputed when a test changes
the setting with ``override_settings``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
    # outlast the slowest view.
    "HEARTBEAT": None,
    # Seconds after its claim that a request's reservation is no longer
    # renewed (a stuck request loses its key LOCK_TIMEOUT later).
    "MAX_RUN_TIME": 300,
    # Seconds a duplicate of a request still running waits for its answer
    # before 409 idempotency_key_in_progress. 0: answer 409 at once.
    "WAIT_FOR_IN_PROGRESS": 0,
    # With WAIT_FOR_IN_PROGRESS: duplicates that may wait at once for one key,
    # and in all in one process (each holds a worker thread under WSGI); any
    # other duplicate gets its 409 at once. None: no bound.
    "MAX_WAITERS_PER_KEY": 1,
    "MAX_WAITERS": 2,
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
    # False: keep 2xx/3xx only, so a client can fix a 4xx request and retry
    # with the same key. True: keep 4xx too, except the statuses in
    # NEVER_RETAINED_CLIENT_ERRORS (401, 403, 408, 409, 429: they may succeed later).
    "RETAIN_CLIENT_ERRORS": False,
    # Dotted path to a function(request, response, exception) -> bool that says
    # whether a 1xx-4xx answer is kept, instead of RETAIN_CLIENT_ERRORS (a 5xx
    # never is). exception: what DRF or ninja turned into the response, else None.
    "RETAIN_FUNCTION": None,
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
    # Retry-After seconds sent with 409 in progress and 503 unavailable.
    "RETRY_AFTER": 1,
    "UNAVAILABLE_RETRY_AFTER": 5,
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
    # The header that marks a replay ("Idempotent-Replayed" for Stripe's clients).
    "REPLAYED_HEADER": "Idempotency-Replayed",
    # A response header that echoes the request's key (e.g. "Idempotency-Key"). None: none.
    "ECHO_KEY_HEADER": None,
    # The header that tells a client its key was not used (the request was not
    # protected), with the reason: "anonymous" or "unprotected". None: none.
    "IGNORED_KEY_HEADER": "Idempotency-Key-Ignored",
    # Problem "type" URIs are this base + the code (e.g. "https://example.com/errors#").
    # None: "about:blank".
    "PROBLEM_TYPE_BASE": None,
    # Dotted path to a function(request, members, headers) -> HttpResponse.
    "PROBLEM_RENDERER": "idempotency_django.protocol.problems.render_problem",
    # On DRF views, raise refusals as idempotency_django.drf.IdempotencyError
    # for DRF's EXCEPTION_HANDLER to render, instead of answering them.
    "DRF_EXCEPTION_HANDLER": False,
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
    # Seconds per bucket of the fallback hash (trigger token + raw body).
    "WEBHOOK_FALLBACK_BUCKET": 300,
    # The URL keyword argument that holds the trigger token.
    "WEBHOOK_TOKEN_KWARG": "token",
    # -- Idempotent background tasks (idempotency_django.tasks) ------------
    # A delivery of a task whose key another delivery is running: "wait" for
    # it (then return its result, or run if it failed); "skip": raise
    # TaskInProgress at once, for the queue to retry later.
    "TASK_DUPLICATES": "wait",
}

#: Never stored or replayed, whatever REPLAY_HEADERS says.
FORBIDDEN_REPLAY_HEADERS = frozenset(
    {"set-cookie", "authorization", "proxy-authorization", "cookie", "www-authenticate"}
)

#: Client errors that stay retryable even with RETAIN_CLIENT_ERRORS: the
#: request may succeed unchanged after a token exchange, a permission fix,
#: a timeout, a conflict or a rate-limit wait.
NEVER_RETAINED_CLIENT_ERRORS = frozenset({401, 403, 408, 409, 429})

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
    HEARTBEAT: float | None
    MAX_RUN_TIME: int
    WAIT_FOR_IN_PROGRESS: float
    MAX_WAITERS_PER_KEY: int | None
    MAX_WAITERS: int | None
    MAX_STORED_BODY: int | None
    MAX_KEYS_PER_PRINCIPAL: int | None
    MAX_FINGERPRINTED_BODY: int | None
    RETAIN_CLIENT_ERRORS: bool
    RETAIN_FUNCTION: Callable[[Any, Any, Any], bool] | None
    REQUIRED: bool
    REQUIRED_PATHS: tuple[re.Pattern[str], ...]
    ATOMIC: bool
    REUSE_STATUS: int
    RETRY_AFTER: int
    UNAVAILABLE_RETRY_AFTER: int
    ANONYMOUS: str
    REPLAY_HEADERS: frozenset[str]
    ENCRYPTION_KEY: str | bytes | None
    ENCRYPTION_KEY_FALLBACKS: Sequence[str | bytes]
    REPLAYED_HEADER: str
    ECHO_KEY_HEADER: str | None
    IGNORED_KEY_HEADER: str | None
    PROBLEM_TYPE_BASE: str | None
    PROBLEM_RENDERER: Callable[[HttpRequest | None, dict[str, Any], dict[str, str]], HttpResponse]
    DRF_EXCEPTION_HANDLER: bool
    REPLAY_HOOK: Callable[[HttpRequest, HttpResponse], HttpResponse] | None
    REQUEST_ID_HEADER: str | None
    WEBHOOK_ID_HEADER: str | None
    WEBHOOK_BODY_ID_FUNCTION: Callable[[HttpRequest], str | None] | None
    WEBHOOK_RETENTION: int
    WEBHOOK_FALLBACK_BUCKET: int
    WEBHOOK_TOKEN_KWARG: str
    TASK_DUPLICATES: str

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
            setattr(self, name, value)
            return value

    def reload(self) -> None:
        for name in DEFAULTS:
            self.__dict__.pop(name, None)


idempotency_settings = IdempotencySettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        idempotency_settings.reload()


setting_changed.connect(_reload)
