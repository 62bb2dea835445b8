"""Celery tasks that run once per key: ``shared_task`` with at-least-once delivery.

::

    from idempotency_django.contrib.celery import shared_task

    @shared_task(key=lambda order_id: f"charge-{order_id}")
    def charge(order_id: int) -> dict: ...

Celery's own ``shared_task``, with the options that make a delivery survive
its worker (``acks_late``, ``reject_on_worker_lost``: a task whose worker
died is delivered again) and :func:`~idempotency_django.tasks.idempotent_task`
between them and the function, so every delivery of one key runs it once.
``TaskInProgress`` (``TASK_DUPLICATES = "skip"``) is retried with a backoff.
Any option given replaces these defaults; ``key``, ``atomic`` and
``retention`` (:class:`~idempotency_django.tasks.TaskOptions`) are
``idempotent_task``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import celery

from idempotency_django.stores import StoreUnavailable
from idempotency_django.tasks import TaskInProgress, idempotent_task, split_options

__all__ = ["DELIVERY_OPTIONS", "shared_task"]

#: At-least-once delivery: acknowledged once the task ran, delivered again when its
#: worker died; a duplicate that did not wait comes back later.
DELIVERY_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    # Nothing ran: retried until the key is free (LOCK_TIMEOUT at most after its
    # holder died) or the store is back, not for Celery's default three times,
    # after which an acknowledged delivery would be lost.
    "autoretry_for": (TaskInProgress, StoreUnavailable),
    "retry_backoff": True,
    "retry_kwargs": {"max_retries": None},
}


@overload
def shared_task(func: Callable[..., Any], /) -> Any: ...


@overload
def shared_task(func: None = None, **options: Any) -> Callable[[Callable[..., Any]], Any]: ...


def shared_task(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``celery.shared_task`` whose deliveries of one key run the function once."""
    once_options, queue_options = split_options(options)

    def decorate(function: Callable[..., Any]) -> Any:
        once = idempotent_task(
            function,
            name=queue_options.get("name"),
            bound=bool(queue_options.get("bind")),
            **once_options,
        )
        return celery.shared_task(**{**DELIVERY_OPTIONS, **queue_options})(once)

    return decorate if func is None else decorate(func)
