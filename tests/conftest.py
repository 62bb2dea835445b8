from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", password="bob-password")


@pytest.fixture
def alice_client(alice: User) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob: User) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """``ATOMIC_REQUESTS = True`` on the default database."""
    database = connections.settings["default"]
    database["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        database["ATOMIC_REQUESTS"] = False
