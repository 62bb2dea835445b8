"""Background tasks that run at most once per key, whatever the queue delivers.

Queues deliver at least once (a redelivery after a worker died, a producer's
retried send). :func:`idempotent_task` runs the deliveries of one key once,
through the protocol a request goes through
(:class:`~idempotency_django.protocol.reservation.KeyReservation`, principal
``task:<task name>``), with a task's answers: the stored return value for a
duplicate, :class:`TaskKeyReused` for other arguments, :class:`TaskInProgress`
for a duplicate that does not wait. With ``atomic`` the claim, the work and the
completion run in one transaction on the default database, as a request's under
``ATOMIC``. :mod:`idempotency_django.contrib.celery` and
:mod:`idempotency_django.contrib.django_tasks` put the queue's own decorator on top.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypedDict, TypeVar, Unpack, cast, overload

from django.db import DEFAULT_DB_ALIAS, transaction
from django.dispatch import Signal

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.fingerprint import keyed_digest
from idempotency_django.protocol.keys import MAX_KEY_LENGTH
from idempotency_django.protocol.logs import emit, error_name
from idempotency_django.protocol.options import check_retention, option
from idempotency_django.protocol.reservation import KeyReservation, Settled
from idempotency_django.protocol.transactions import open_transactions
from idempotency_django.stores import (
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)

__all__ = [
    "KEY_ARGUMENT",
    "TaskInProgress",
    "TaskKeyReused",
    "TaskOptions",
    "TaskResultNotStored",
    "idempotent_task",
]

logger = logging.getLogger("idempotency_django.tasks")

P = ParamSpec("P")
R = TypeVar("R")

#: Prefix of a task record's principal; the rest is the task's name.
TASK_PREFIX = "task:"
#: The keyword argument a caller passes the key in, when the task has no key function.
KEY_ARGUMENT = "idempotency_key"


class TaskInProgress(Exception):
    """Another delivery of this key is running (the task's ``duplicates="skip"``).

    Nothing ran. Let the queue retry it later (Celery: ``autoretry_for``): the
    retry then returns the first delivery's result, or runs if that one failed.
    Raised inside a view (a task run in-process), the middleware answers
    ``409 idempotency_key_in_progress``.
    """

    code = "idempotency_key_in_progress"


class TaskKeyReused(ValueError):
    """The key was used before with other arguments: nothing ran.

    Raised inside a view, the middleware answers ``409 idempotency_key_reused``.
    """

    code = "idempotency_key_reused"


class TaskResultNotStored(RuntimeError):
    """The key's task ran, but returned what its queue's JSON cannot hold: nothing to return.

    It does not run again: its work is done.
    """


#: What is kept when the work committed but its result could not be stored.
NOT_STORED = StoredResponse(status=200, headers=(), body=b"", body_omitted=True)


@dataclass(frozen=True)
class Codec:
    """A queue's JSON: ``dumps`` canonical (its text is what the fingerprint hashes)."""

    dumps: Callable[[Any], str]
    loads: Callable[[str], Any]


#: What Django's tasks framework passes.
JSON = Codec(
    functools.partial(json.dumps, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
    json.loads,
)


class TaskOptions(TypedDict, total=False):
    """The options of :func:`idempotent_task` that the queues' decorators take too."""

    key: Callable[..., Any] | None
    atomic: bool
    retention: int | None
    duplicates: Literal["wait", "skip"]


def split_options(options: dict[str, Any]) -> tuple[TaskOptions, dict[str, Any]]:
    """A queue decorator's options: the :class:`TaskOptions`, and the queue's own (the rest)."""
    ours = TaskOptions.__optional_keys__
    task = {name: value for name, value in options.items() if name in ours}
    queue = {name: value for name, value in options.items() if name not in ours}
    return cast(TaskOptions, task), queue


@overload
def idempotent_task(
    func: Callable[P, R],
    *,
    name: str | None = None,
    bound: bool = False,
    codec: Codec = JSON,
    **options: Unpack[TaskOptions],
) -> Callable[..., R]: ...


@overload
def idempotent_task(
    func: None = None,
    *,
    name: str | None = None,
    bound: bool = False,
    codec: Codec = JSON,
    **options: Unpack[TaskOptions],
) -> Callable[[Callable[P, R]], Callable[..., R]]: ...


def idempotent_task(
    func: Callable[P, R] | None = None,
    *,
    name: str | None = None,
    bound: bool = False,
    codec: Codec = JSON,
    **options: Unpack[TaskOptions],
) -> Any:
    """Run the decorated function at most once per key; return the stored result after.

    ``key`` is a function of the task's arguments that returns its key
    (``key=lambda order_id: f"order-{order_id}"``); without it each call
    passes one as the keyword argument ``idempotency_key``, which the
    function does not get. A view derives that key from its own request
    with [`downstream_key`][idempotency_django.downstream.downstream_key]:
    never pass a client's raw ``Idempotency-Key``, which is not scoped to its
    principal.
    ``name`` (by default ``module.qualname``) scopes the keys. The return
    value must be JSON (``codec``'s): it is what duplicates return. ``atomic``
    (the default) runs it in a transaction. ``retention`` (seconds) defaults
    to ``RETENTION``. ``duplicates="skip"`` raises
    [`TaskInProgress`][idempotency_django.tasks.TaskInProgress] at once for a
    delivery whose key another delivery runs, instead of waiting for it.
    ``bound``: the first argument is the queue's own
    (Celery's bound task, django.tasks' context); the function gets it, the
    key and the fingerprint do not.

    The wrapper's ``check_call(args, kwargs)`` raises, before anything is
    sent, what a delivery of those arguments would: a missing or bad key,
    arguments the fingerprint cannot hold.
    """
    unknown = options.keys() - TaskOptions.__optional_keys__
    if unknown:
        raise TypeError(f"idempotent_task() got unknown options: {', '.join(sorted(unknown))}.")
    check_retention(options.get("retention"))
    if options.get("duplicates", "wait") not in ("wait", "skip"):
        raise ValueError(f"duplicates must be 'wait' or 'skip', not {options['duplicates']!r}.")

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        task = _Task(name or f"{function.__module__}.{function.__qualname__}", codec, options)
        if inspect.iscoroutinefunction(function):
            # Its wrapper would store the coroutine, never run it.
            raise TypeError(f"{task.name} is async: idempotent_task wraps plain functions.")

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            given = kwargs.pop(KEY_ARGUMENT, None)
            if not idempotency_settings.ENABLED:
                return function(*args, **kwargs)
            run = TaskRun(task, *task.identify(given, args[1:] if bound else args, kwargs))
            return run.run(lambda: function(*args, **kwargs))

        def check_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            kwargs = dict(kwargs)
            task.identify(kwargs.pop(KEY_ARGUMENT, None), args, kwargs)

        wrapper.check_call = check_call  # type: ignore[attr-defined]
        return wrapper

    return decorate if func is None else decorate(func)


def queue_task(
    func: Callable[..., Any] | None,
    options: dict[str, Any],
    *,
    make: Callable[[Callable[..., Any], dict[str, Any]], Any],
    bound_option: str,
    codec: Codec = JSON,
) -> Any:
    """A queue's decorator (``make(function, queue_options)``) over :func:`idempotent_task`.

    ``bound_option`` is the queue's option that passes its own first argument.
    """
    once_options, queue_options = split_options(options)

    def decorate(function: Callable[..., Any]) -> Any:
        bound = bool(queue_options.get(bound_option))
        name = queue_options.get("name")
        once = idempotent_task(function, name=name, bound=bound, codec=codec, **once_options)
        return make(once, queue_options)

    return decorate if func is None else decorate(func)


@dataclass(frozen=True)
class _Task:
    """What one decorated function's deliveries share."""

    name: str
    codec: Codec
    options: TaskOptions

    def identify(
        self, given: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[RecordKey, RequestInfo]:
        """The record and the fingerprint of a delivery: ``given`` is the caller's key, if any."""
        key = self.options.get("key")
        if key is not None:
            if given is not None:
                raise TypeError(f"{self.name} makes its own key: pass no {KEY_ARGUMENT}.")
            given = key(*args, **kwargs)
        elif given is None:
            raise TypeError(f"{self.name} needs a key: pass {KEY_ARGUMENT}=...")
        try:
            canonical = self.codec.dumps([self.name, list(args), kwargs])
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(
                f"{self.name}'s arguments cannot be fingerprinted: {exc}. Pass what the "
                "queue's JSON holds (for Celery: JSON, UUID, datetime, date, time, Decimal)."
            ) from exc
        # Keyed as a request's is: a stored fingerprint tells nothing of the arguments.
        fingerprint = keyed_digest([canonical.encode()])
        info = RequestInfo(method="TASK", path=self.name, fingerprint=fingerprint, kind="task")
        return RecordKey(TASK_PREFIX + self.name, "", _task_key(given)), info


class TaskRun(KeyReservation):
    """One delivery of a keyed task: claim, run, then settle or release."""

    def __init__(self, task: _Task, key: RecordKey, info: RequestInfo) -> None:
        retention = option(task.options.get("retention"), idempotency_settings.RETENTION)
        super().__init__(key, info, int(retention))
        self.task = task
        self.atomic = task.options.get("atomic", True)

    def block(self) -> contextlib.AbstractContextManager[Any]:
        """The transaction the claim, the work and the completion run in (``atomic``)."""
        atomic = transaction.atomic(using=DEFAULT_DB_ALIAS)
        return atomic if self.atomic else contextlib.nullcontext()

    def run(self, call: Callable[[], R]) -> R:
        """Run ``call`` once for the key, or answer for the delivery that did."""
        name = self.task.name
        while True:
            try:
                with self.block():
                    try:
                        claim = self.take()
                    except StoreUnavailable as exc:
                        self.log(logging.ERROR, "unavailable", error=error_name(exc))
                        raise
                    if claim.outcome is Outcome.CLAIMED:
                        # The run's one INFO record is its outcome, at its end.
                        self.log(logging.DEBUG, "took_over" if claim.took_over else "reserved")
                        return self.run_claimed(call)
            except BaseException:
                if self.atomic:
                    self.commit_failed()  # a COMMIT that failed stored nothing: a retry runs
                # Without our block, the caller's transaction decides (a result that is
                # not JSON raised after its work): its COMMIT stores the deferred answer,
                # its rollback drops it, and the key expires LOCK_TIMEOUT later.
                raise
            if claim.outcome is Outcome.REPLAY:
                assert claim.response is not None
                self.log(logging.INFO, "replayed")
                if claim.response.body_omitted:
                    raise TaskResultNotStored(
                        f"This {name} ran, but its result could not be stored: "
                        "there is nothing to return, and it does not run again."
                    )
                return cast(R, self.task.codec.loads(claim.response.body.decode()))
            if claim.outcome is Outcome.REUSED:
                self.log(logging.INFO, "conflict", code=TaskKeyReused.code)
                raise TaskKeyReused(f"The key of this {name} was used with other arguments.")
            # In progress: the other delivery holds the key. Waited for outside
            # any transaction of ours, then claimed again: it may have failed.
            # Waiting inside a caller's transaction (an eager task in a view)
            # would hold its locks, and not see the other's reservation commit.
            if self.task.options.get("duplicates", "wait") == "skip" or open_transactions():
                self.log(logging.INFO, "conflict", code=TaskInProgress.code)
                raise TaskInProgress(f"This {name} is running in another delivery.")
            self.log(logging.DEBUG, "waiting")
            with contextlib.suppress(StoreUnavailable):  # the claim then says it is down
                self.store.wait(self.key, self.lock_timeout)

    def run_claimed(self, call: Callable[[], R]) -> R:
        """The key is ours: run, then settle the result as a request settles its response."""
        try:
            result = call()
        except BaseException:
            self.give_up()
            raise
        try:
            body = self.task.codec.dumps(result).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            if self.atomic:
                self.give_up()  # raised in our block: the work rolls back
            else:
                # Autocommitted, or the caller's transaction to commit: the work
                # stands, so the key is kept, with no result to return.
                self.settle(NOT_STORED)
            raise TypeError(
                f"{self.task.name} returned {type(result).__name__}, which is not JSON "
                "its queue can hold: an idempotent task's result is stored for its duplicates."
            ) from exc
        settled = self.settle(StoredResponse(status=200, headers=(), body=body))
        if settled is Settled.LOST:
            raise TaskInProgress(
                f"This {self.task.name} ran past LOCK_TIMEOUT: another delivery has it."
            )
        if settled is Settled.UNAVAILABLE:
            raise StoreUnavailable(f"The result of this {self.task.name} could not be kept.")
        return cast(R, self.task.codec.loads(body.decode()))

    def give_up(self) -> None:
        """The work failed: give the key back, unless it goes with the rollback of our block."""
        if not (self.atomic and self.joined_transaction):
            self.release(None, "exception")

    def send(self, signal: Signal, **kwargs: Any) -> None:
        """The signals are a request's (their receivers get it): a task sends none."""

    def log(self, level: int, event: str, **fields: Any) -> None:
        """The task's name and the key's digest: never the key or the arguments."""
        if logger.isEnabledFor(level):
            fields.pop("status", None)  # a task's result has no HTTP status
            fields = {"event": event, "task": self.task.name, "key_digest": self.digest, **fields}
            emit(level, fields, to=logger)


def _task_key(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        # str(None) would be one key shared by every call.
        raise ValueError(f"A task key must be a string or an integer, not {type(value).__name__}.")
    key = str(value)
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ValueError(
            f"A task key must be 1 to {MAX_KEY_LENGTH} printable characters, not {key[:40]!r}..."
        )
    return key
