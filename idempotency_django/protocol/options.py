"""What a view asks of the protocol: its :class:`ViewOptions`, each falling back to its setting.

``@idempotent(...)``, the DRF mixin's ``idempotency_options`` and ninja's
``idempotent(...)`` all build a :class:`ViewOptions`; the phases read an option
through :func:`option` (its value, else the setting's) and a function through
:func:`function` (given itself or by dotted path, else the setting's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.scope import Scope, session_scope

OptionT = TypeVar("OptionT")


#: The longest expiry, in seconds, a setting or an option may ask for: a century.
#: A record's expiry is the database's now plus it, and far beyond that it cannot
#: be written (MariaDB, SQLite: past the year 9999) or read back (PostgreSQL).
MAX_SECONDS = 100 * 365 * 24 * 3600


def check_retention(value: Any) -> None:
    """Refuse a ``retention`` that is not None or a whole number of seconds, 1 to a century.

    0 or less would keep an answer for no time at all, so that every retry ran
    the work again; past a century the store cannot write the expiry.
    """
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SECONDS:
        raise ValueError(
            f"retention must be a whole number of seconds from 1 to {MAX_SECONDS} (100 years), "
            f"not {value!r}."
        )


#: ``RETAIN_FUNCTION``: whether an answer is kept for replay, given the request,
#: the response and the exception DRF or ninja turned into it (None if none).
RetainFunction = Callable[[HttpRequest, HttpResponseBase, Exception | None], bool]


@dataclass(frozen=True)
class ViewOptions:
    """Per-view overrides of the global settings; None means "use the setting"."""

    required: bool | None = None
    retention: int | None = None
    retain_client_errors: bool | None = None
    atomic: bool | None = None
    max_stored_body: int | None = None
    wait_for_in_progress: float | None = None
    #: A function (or its dotted path) used instead of ``FINGERPRINT_FUNCTION``.
    fingerprint: Callable[[HttpRequest], str] | str | None = None
    #: A function (or its dotted path) used instead of ``SCOPE_FUNCTION``.
    scope: Callable[[HttpRequest], Scope | None] | str | None = None
    #: A function (or its dotted path) used instead of ``RETAIN_FUNCTION``.
    retain: RetainFunction | str | None = None
    #: Seconds in which an authenticated request without a key is answered as the same
    #: request of its principal was (its fingerprint is its key). None: no window.
    window: int | None = None

    def __post_init__(self) -> None:
        check_retention(self.retention)
        check_retention(self.window)


def scope_of(request: HttpRequest, options: ViewOptions) -> Scope | None:
    """Whose key it is: the view's scope function or ``SCOPE_FUNCTION``, else a guest's session."""
    chosen = options.scope
    scope_function = (
        idempotency_settings.SCOPE_FUNCTION if chosen is None else function(chosen, None)
    )
    scope: Scope | None = scope_function(request)
    if scope is None and idempotency_settings.ANONYMOUS == "session":
        scope = session_scope(request)
    return scope


def function(value: Callable[..., Any] | str | None, default: Callable[..., Any] | None) -> Any:
    """A view's own function (given itself or by dotted path), else the setting's."""
    if value is None:
        return default
    return _imported(value) if isinstance(value, str) else value


@functools.cache
def _imported(path: str) -> Any:
    return import_string(path)


def option(value: OptionT | None, default: OptionT) -> OptionT:
    return default if value is None else value
