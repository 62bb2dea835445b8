"""pytest fixtures for the example project's tests."""

import os

import pytest
from django.conf import settings


@pytest.fixture(autouse=True)
def _empty_idempotency_store(idempotency_store):
    """Each test starts with no stored keys, also on Redis, which a test's rollback
    leaves alone (and where a user id reused by the next test would find them)."""


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    # Runs sharing a database server (the repository's suite, CI) each need a test
    # database of their own.
    name = os.environ.get("EXAMPLE_TEST_DATABASE_NAME")
    if name:
        settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = name
