"""Counting decisions with the signals, as docs/signals.md shows."""

from __future__ import annotations

from collections import Counter

from django.dispatch import receiver

from idempotency_django import signals

# --8<-- [start:metrics]
#: In production, increment your metrics client's counters instead.
DECISIONS: Counter[str] = Counter()


@receiver(signals.reserved)
def count_reserved(sender, **kwargs):
    DECISIONS["reserved"] += 1


@receiver(signals.replayed)
def count_replayed(sender, status, **kwargs):
    DECISIONS[f"replayed:{status}"] += 1


@receiver(signals.conflict)
def count_conflict(sender, code, **kwargs):
    DECISIONS[f"conflict:{code}"] += 1


@receiver(signals.stored)
def count_stored(sender, status, **kwargs):
    DECISIONS[f"stored:{status}"] += 1


@receiver(signals.released)
def count_released(sender, reason, **kwargs):
    DECISIONS[f"released:{reason}"] += 1


@receiver(signals.unavailable)
def count_unavailable(sender, error, **kwargs):
    DECISIONS["unavailable"] += 1  # page someone: keyed writes are being refused


# --8<-- [end:metrics]
