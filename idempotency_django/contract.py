"""``idempotency_django.contract`` of 0.2.0, now
:mod:`idempotency_django.stores.contract`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.stores import contract as _new
from idempotency_django.stores.contract import *  # noqa: F403

__getattr__ = moved(__name__, _new)
