"""Prometheus counters for the key contract, fed by :mod:`idempotency_django.signals`.

Connect once, e.g. in an ``AppConfig.ready``::

    from idempotency_django.contrib import prometheus

    prometheus.connect()  # or connect(registry=my_registry)

One counter, ``idempotency_decisions_total``, labelled by ``decision``
(``reserved``, ``replayed``, ``conflict``, ``stored``, ``released``,
``unavailable``), ``code`` (conflicts: ``idempotency_key_reused`` or
``idempotency_key_in_progress``) and ``reason`` (releases: ``server_error``,
``not_retained``, ``streaming``, ``rolled_back``, ``exception``). Labels that
do not apply to a decision are empty. Needs ``prometheus-client``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from idempotency_django import signals

__all__ = ["METRIC_NAME", "connect", "disconnect"]

METRIC_NAME = "idempotency_decisions"  # exposed as idempotency_decisions_total
LABELS = ("decision", "code", "reason")

_lock = threading.Lock()
_counter: Counter | None = None
_registry: CollectorRegistry | None = None


def connect(registry: CollectorRegistry | None = None) -> Counter:
    """Create the counter in ``registry`` (the default one if None) and count each signal.

    Safe to call more than once: a second call with the same registry changes
    nothing; with another registry the counter moves there.
    """
    global _counter, _registry
    target = REGISTRY if registry is None else registry
    with _lock:
        if _counter is not None and _registry is target:
            return _counter
        _disconnect_locked()
        _counter = Counter(
            METRIC_NAME,
            "Idempotency-Key decisions, by decision (and conflict code or release reason).",
            labelnames=LABELS,
            registry=target,
        )
        _registry = target
        for signal, receiver in _RECEIVERS:
            signal.connect(receiver, weak=False, dispatch_uid=_uid(receiver))
        return _counter


def disconnect() -> None:
    """Stop counting and remove the counter from its registry. Safe when not connected."""
    with _lock:
        _disconnect_locked()


def _disconnect_locked() -> None:
    global _counter, _registry
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=_uid(receiver))
    if _counter is not None and _registry is not None:
        with contextlib.suppress(KeyError):  # already unregistered by the project
            _registry.unregister(_counter)
    _counter = None
    _registry = None


def _uid(receiver: Any) -> str:
    return f"idempotency_django.contrib.prometheus.{receiver.__name__}"


def _counting(decision: str) -> Callable[..., None]:
    # Only ``conflict`` sends a code and only ``released`` a reason: the other
    # decisions' labels stay empty.
    def receiver(sender: Any, *, code: str = "", reason: str = "", **kwargs: Any) -> None:
        counter = _counter
        if counter is not None:
            counter.labels(decision=decision, code=str(code), reason=str(reason)).inc()

    receiver.__name__ = f"_on_{decision}"
    return receiver


#: Each signal counts as the decision of its own name.
_RECEIVERS = tuple(
    (getattr(signals, decision), _counting(decision))
    for decision in ("reserved", "replayed", "conflict", "stored", "released", "unavailable")
)
