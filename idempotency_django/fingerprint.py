"""``idempotency_django.fingerprint`` of 0.2.0, now
:mod:`idempotency_django.protocol.fingerprint`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.protocol import fingerprint as _new
from idempotency_django.protocol.fingerprint import *  # noqa: F403

__getattr__ = moved(__name__, _new)
