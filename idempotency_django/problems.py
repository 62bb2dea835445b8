"""``idempotency_django.problems`` of 0.2.0, now
:mod:`idempotency_django.protocol.problems`: this path warns."""

from idempotency_django._moved import moved
from idempotency_django.protocol import problems as _new
from idempotency_django.protocol.problems import *  # noqa: F403

__getattr__ = moved(__name__, _new)
