"""Django's tasks framework (``django.tasks``, or the ``django-tasks`` backport): once per key.

::

    from idempotency_django.contrib.django_tasks import task

    @task(key=lambda order_id: f"charge-{order_id}")
    def charge(order_id: int) -> dict: ...

    charge.enqueue(42)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from idempotency_django.tasks import queue_task

try:
    from django.tasks import task as framework_task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the backport
    from django_tasks import task as framework_task  # type: ignore[import-not-found,no-redef,unused-ignore]

__all__ = ["task"]


@overload
def task(func: Callable[..., Any], /) -> Any: ...


@overload
def task(func: None = None, **options: Any) -> Callable[[Callable[..., Any]], Any]: ...


def task(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """The framework's ``@task``, whose runs of one key run the function once.

    ``key``, ``atomic``, ``retention`` and ``duplicates`` are ``idempotent_task``'s;
    the other options the framework's. Its arguments are fingerprinted as the plain
    JSON the framework requires when a task is enqueued.
    """
    return queue_task(
        func,
        options,
        make=lambda once, queue_options: framework_task(**queue_options)(once),
        bound_option="takes_context",
    )
