"""The checks of configurations where a transaction decides, or where one cannot."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections

from idempotency_django.checks import check_middleware, check_transactions

SYNC_ONLY = "tests.hangup.middleware.SyncOnly"
IDEMPOTENCY = "idempotency_django.middleware.IdempotencyMiddleware"


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_a_sync_only_middleware_after_ours_is_named(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, SYNC_ONLY]
    (warning,) = [m for m in check_middleware() if m.id == "idempotency_django.W040"]
    assert SYNC_ONLY in warning.msg


def test_a_sync_only_middleware_before_ours_is_fine(settings: Any) -> None:
    middleware = [m for m in settings.MIDDLEWARE if m != IDEMPOTENCY]
    settings.MIDDLEWARE = [SYNC_ONLY, *middleware, IDEMPOTENCY]
    assert "idempotency_django.W040" not in ids(check_middleware())


def test_retaining_client_errors_under_atomic_requests_with_drf_is_explained(
    settings: Any, atomic_requests: None
) -> None:
    settings.IDEMPOTENCY = {
        "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"
    }
    assert ids(check_transactions()) == ["idempotency_django.W041"]
    settings.IDEMPOTENCY = {}
    assert ids(check_transactions()) == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_atomic_requests_on_two_databases_is_named(settings: Any) -> None:
    settings.DATABASES = {
        "default": {**connections.settings["default"], "ATOMIC_REQUESTS": True},
        "other": {"ENGINE": "django.db.backends.sqlite3", "ATOMIC_REQUESTS": True},
    }
    (warning,) = check_transactions()
    assert warning.id == "idempotency_django.W042" and "default, other" in warning.msg


@pytest.mark.django_db  # Django 6 runs the database checks with the others
def test_the_checks_run_with_manage_py_check(settings: Any, atomic_requests: None) -> None:
    settings.IDEMPOTENCY = {
        "RETAIN_FUNCTION": "idempotency_django.protocol.retention.retain_client_errors"
    }
    with pytest.raises(SystemCheckError, match="W041"):
        call_command("check", "--fail-level", "WARNING")
