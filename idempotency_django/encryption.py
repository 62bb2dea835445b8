"""``idempotency_django.encryption`` of 0.2.0, now
:mod:`idempotency_django.stores.encryption`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.stores import encryption as _new
from idempotency_django.stores.encryption import *  # noqa: F403

__getattr__ = moved(__name__, _new)
