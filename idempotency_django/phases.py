"""``idempotency_django.phases`` of 0.2.0, now
:mod:`idempotency_django.protocol.phases`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.protocol import phases as _new
from idempotency_django.protocol.phases import *  # noqa: F403

__getattr__ = moved(__name__, _new)
