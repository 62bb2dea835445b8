"""Celery tasks that run once per key: ``shared_task`` with at-least-once delivery.

::

    from idempotency_django.contrib.celery import shared_task

    @shared_task(key=lambda order_id: f"charge-{order_id}")
    def charge(order_id: int) -> dict: ...

Arguments and results are fingerprinted and stored as kombu's JSON holds them
(``UUID``, ``datetime``, ``Decimal``... come back as themselves).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, overload

import celery
from kombu.utils import json as kombu_json

from idempotency_django.stores import StoreUnavailable
from idempotency_django.tasks import Codec, TaskInProgress, queue_task

__all__ = ["DELIVERY_OPTIONS", "KOMBU_JSON", "CheckedTask", "shared_task"]

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
    # No max_retries here: CheckedTask.retry lifts the limit for these two alone, and a
    # task's own retries keep theirs.
}

#: kombu's JSON, canonical: what Celery's default serializer round-trips.
KOMBU_JSON = Codec(
    functools.partial(kombu_json.dumps, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
    kombu_json.loads,
)


class CheckedTask(celery.Task):  # type: ignore[misc]
    """Refuses, when sent, a call whose delivery could only fail: no key, arguments not JSON.

    A worker that got it would fail before claiming the key, and Celery would
    acknowledge that failure: the task would be lost.
    """

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        check = getattr(self.run, "check_call", None)
        if check is not None:
            check(tuple(args or ()), dict(kwargs or {}))
        return super().apply_async(args, kwargs, *rest, **options)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: Any = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's; a delivery that ran nothing (its key taken, the store down) is retried
        without a limit, and an eager run of it is not retried.

        Nothing ran: Celery's default of three retries would acknowledge, so lose,
        the delivery. (Its ``max_retries=None`` means "the task's limit", three; the
        task's own ``self.retry()`` keeps that limit.) An eager run (``apply()``,
        ``task_always_eager``) is retried by Celery at once, on the same stack, its
        countdown skipped: it would spin while another delivery holds the key, or
        recurse until the stack overflowed while the store is down; in its caller's
        transaction it would hold the caller's locks meanwhile. Its caller gets
        ``TaskInProgress`` or ``StoreUnavailable`` instead, as a direct call does.
        """
        if isinstance(exc, TaskInProgress | StoreUnavailable):
            if self.request.is_eager:
                raise exc
            max_retries = sys.maxsize
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)


@overload
def shared_task(func: Callable[..., Any], /) -> Any: ...


@overload
def shared_task(func: None = None, **options: Any) -> Callable[[Callable[..., Any]], Any]: ...


def shared_task(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``celery.shared_task`` whose deliveries of one key run the function once.

    With at-least-once delivery (``DELIVERY_OPTIONS``, which any option
    given replaces) and a ``base`` that refuses, when sent, a call that names no
    key or whose arguments cannot be fingerprinted. ``key``, ``atomic``,
    ``retention`` and ``duplicates`` are ``idempotent_task``'s.
    """

    def make(once: Callable[..., Any], queue_options: dict[str, Any]) -> Any:
        base = queue_options.get("base") or celery.Task
        if not issubclass(base, CheckedTask):
            base = type(f"Checked{base.__name__}", (CheckedTask, base), {})
        return celery.shared_task(**{**DELIVERY_OPTIONS, **queue_options, "base": base})(once)

    return queue_task(func, options, make=make, bound_option="bind", codec=KOMBU_JSON)
