"""``idempotency_django.scope`` of 0.2.0, now
:mod:`idempotency_django.protocol.scope`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.protocol import scope as _new
from idempotency_django.protocol.scope import *  # noqa: F403

__getattr__ = moved(__name__, _new)
