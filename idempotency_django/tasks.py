"""Background tasks that run at most once per key, whatever the queue delivers.

Queues deliver at least once: Celery redelivers a task whose worker died
under ``acks_late``, a producer's retried ``apply_async`` or ``enqueue``
sends it twice. :func:`idempotent_task` wraps the task's function so that
the deliveries of one key run it once, with the request path's stores and
rules:

* the first delivery claims the key (principal ``task:<task name>``) and runs;
* a duplicate while it runs waits for it, or raises :class:`TaskInProgress`
  at once (``TASK_DUPLICATES``);
* a completed one returns the stored return value without running;
* a failed one (it raised) gives the key back, so a retry runs;
* the same key with other arguments raises :class:`TaskKeyReused`.

With the database store (and ``atomic``, the default) the claim, the task's
writes and the stored result are one transaction: they commit together, and
a worker that dies mid-task rolls all of them back. With another store the
writes run in a transaction on the default database; the reservation is
renewed before it commits (a task that lost its key to a takeover rolls
back), and the result is stored once it has committed.

The decorator is framework-neutral: put the queue's own decorator on top
(``@app.task`` for Celery, ``@task`` for Django's tasks framework).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack, cast, overload

from django.db import DEFAULT_DB_ALIAS, transaction
from django.dispatch import Signal

from idempotency_django.conf import idempotency_settings
from idempotency_django.heartbeat import start_beat
from idempotency_django.keys import MAX_KEY_LENGTH
from idempotency_django.options import check_retention, option
from idempotency_django.reservation import KeyReservation
from idempotency_django.stores import (
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    StoreUnavailable,
)
from idempotency_django.transactions import open_transactions

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
    """Another delivery of this key is running (``TASK_DUPLICATES = "skip"``).

    Nothing ran. Let the queue retry it later (Celery: ``autoretry_for``): the
    retry then returns the first delivery's result, or runs if that one failed.
    """

    code = "idempotency_key_in_progress"


class TaskKeyReused(ValueError):
    """The key was used before with other arguments: nothing ran."""

    code = "idempotency_key_reused"


class TaskResultNotStored(RuntimeError):
    """The key's task ran, but returned what JSON cannot hold: nothing to return.

    It does not run again: its work is done. Return JSON-serialisable values.
    """


#: What is kept when the work committed but its result could not be stored.
NOT_STORED = StoredResponse(status=200, headers=(), body=b"", body_omitted=True)


class _Ran:
    """What a delivery outside the store's transaction did: committed, and its answer."""

    def __init__(self) -> None:
        self.committed = False
        self.stored: StoredResponse | None = None

    def commit(self) -> None:
        self.committed = True


class _LostReservation(Exception):
    """The key was taken over while the task ran: its writes must not commit."""


class TaskOptions(TypedDict, total=False):
    """The options of :func:`idempotent_task` that the queues' decorators take too."""

    key: Callable[..., Any] | None
    atomic: bool
    retention: int | None


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
    **options: Unpack[TaskOptions],
) -> Callable[..., R]: ...


@overload
def idempotent_task(
    func: None = None,
    *,
    name: str | None = None,
    bound: bool = False,
    **options: Unpack[TaskOptions],
) -> Callable[[Callable[P, R]], Callable[..., R]]: ...


def idempotent_task(
    func: Callable[P, R] | None = None,
    *,
    name: str | None = None,
    bound: bool = False,
    **options: Unpack[TaskOptions],
) -> Any:
    """Run the decorated function at most once per key; return the stored result after.

    ``key`` is a function of the task's arguments that returns its key
    (``key=lambda order_id: f"order-{order_id}"``); without it each call
    passes one as the keyword argument ``idempotency_key``, which the
    function does not get. ``name`` (by default ``module.qualname``) scopes
    the keys. The return value must be JSON-serialisable: it is what
    duplicates return. ``atomic`` (the default) runs it in a transaction.
    ``retention`` (seconds) defaults to ``RETENTION``.
    ``bound``: the first argument is the queue's own (Celery's bound task,
    django.tasks' context); the function gets it, the key and the fingerprint do not.
    """
    unknown = options.keys() - TaskOptions.__optional_keys__
    if unknown:
        raise TypeError(f"idempotent_task() got unknown options: {', '.join(sorted(unknown))}.")
    key = options.get("key")
    atomic = options.get("atomic", True)
    retention = options.get("retention")
    check_retention(retention)

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        task_name = name or f"{function.__module__}.{function.__qualname__}"
        if inspect.iscoroutinefunction(function):
            # Its wrapper would store the coroutine, never run it.
            raise TypeError(f"{task_name} is async: idempotent_task wraps plain functions.")

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            given = kwargs.pop(KEY_ARGUMENT, None)
            if not idempotency_settings.ENABLED:
                return function(*args, **kwargs)
            arguments = args[1:] if bound else args
            if key is not None:
                if given is not None:
                    raise TypeError(f"{task_name} makes its own key: pass no {KEY_ARGUMENT}.")
                given = key(*arguments, **kwargs)
            elif given is None:
                raise TypeError(f"{task_name} needs a key: pass {KEY_ARGUMENT}=...")
            run = TaskRun(task_name, _task_key(given), arguments, kwargs, atomic, retention)
            result: R = run.run(lambda: function(*args, **kwargs))
            return result

        return wrapper

    return decorate if func is None else decorate(func)


class TaskRun(KeyReservation):
    """One delivery of a keyed task: claim, run, then complete or release."""

    def __init__(
        self,
        name: str,
        key: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        atomic: bool,
        retention: int | None,
    ) -> None:
        info = RequestInfo(
            method="TASK",
            path=name,
            fingerprint=fingerprint(name, args, kwargs),
            kind="task",
        )
        super().__init__(RecordKey(TASK_PREFIX + name, "", key), info)
        self.name = name
        self.atomic = atomic
        self.retention_seconds = retention
        # Read once: the claim, the renewals and the waits of one delivery agree.
        self.lock_timeout_seconds = int(idempotency_settings.LOCK_TIMEOUT)

    def retention(self) -> int:
        return int(option(self.retention_seconds, idempotency_settings.RETENTION))

    def lock_timeout(self) -> int:
        return self.lock_timeout_seconds

    def run(self, call: Callable[[], R]) -> R:
        """Run ``call`` once for the key, or answer for the delivery that did."""
        # The database store's claim joins the task's transaction on the default
        # database; a store elsewhere (Redis, another database) stays outside it.
        in_work = self.store.database_alias == DEFAULT_DB_ALIAS
        claim_block = self.transaction(DEFAULT_DB_ALIAS) if in_work else contextlib.nullcontext
        while True:
            with claim_block():
                try:
                    claim = self.store.claim(self.key, self.info, self.lock_timeout())
                except StoreUnavailable:
                    self.log(logging.ERROR, "unavailable")
                    raise
                if claim.outcome is Outcome.CLAIMED:
                    self.token = claim.token
                    self.log(logging.INFO, "took_over" if claim.took_over else "reserved")
                    if in_work and self.store.joins_transaction():
                        return self.run_inside(call)
                    return self.run_outside(call)
                if claim.outcome is Outcome.REPLAY:
                    assert claim.response is not None
                    self.log(logging.INFO, "replayed")
                    if claim.response.body_omitted:
                        raise TaskResultNotStored(
                            f"This {self.name} ran, but its result was not JSON: "
                            "there is nothing to return, and it does not run again."
                        )
                    return json.loads(claim.response.body)  # type: ignore[no-any-return]
                if claim.outcome is Outcome.REUSED:
                    self.log(logging.INFO, "conflict", code=TaskKeyReused.code)
                    raise TaskKeyReused(
                        f"The key of this {self.name} was used with other arguments."
                    )
            # In progress: the other delivery holds the key. Waited for outside
            # any transaction of ours, then claimed again: it may have failed.
            if idempotency_settings.TASK_DUPLICATES == "skip" or open_transactions():
                # Waiting inside a caller's transaction (an eager task in a view)
                # would hold its locks, and not see the other's reservation commit.
                self.log(logging.INFO, "conflict", code=TaskInProgress.code)
                raise TaskInProgress(f"This {self.name} is running in another delivery.")
            self.log(logging.INFO, "waiting")
            with contextlib.suppress(StoreUnavailable):  # the claim then says it is down
                self.store.wait(self.key, self.lock_timeout())

    def run_inside(self, call: Callable[[], R]) -> R:
        """The claim is in the task's transaction: the result commits with the work."""
        try:
            result = call()
            stored = self.stored(result)
        except BaseException:
            if not self.atomic:
                # No transaction of ours rolls the reservation back: the
                # caller's may commit it, with whatever the task wrote.
                self.release(None, "exception")
            raise
        # Not complete(): a store that fails here must raise, rolling the work
        # back with the reservation: no result, no work.
        self.store.complete(self.key, self.token, stored, self.retention(), request=self.info)
        self.log(logging.INFO, "stored")
        return json.loads(stored.body)  # type: ignore[no-any-return]

    def run_outside(self, call: Callable[[], R]) -> R:
        """The store is outside the work's transaction: renew before it commits, store after.

        Once the work has committed the key is never given back, whatever
        raises next (a hook of the task's own run after the commit, a result
        that is not JSON): its answer is stored, or the key kept.
        """
        self.beat = start_beat(self.store, self.key, self.token, self.info, self.lock_timeout())
        in_callers_transaction = DEFAULT_DB_ALIAS in open_transactions()
        ran = _Ran()
        if in_callers_transaction:
            # Hooked ahead of any hook the task adds: none of those that raises
            # at the caller's commit can skip the completion.
            transaction.on_commit(functools.partial(self.complete_ran, ran), robust=True)
        try:
            with self.transaction(DEFAULT_DB_ALIAS)():
                if self.atomic and not in_callers_transaction:
                    # The first hook of our transaction: it runs right after the
                    # COMMIT, before any of the task's (which may raise).
                    transaction.on_commit(ran.commit)
                result = call()
                if not self.atomic and not in_callers_transaction:
                    ran.commit()  # autocommit: what the task wrote is written
                ran.stored = self.stored(result)
                if self.atomic and not self.store.renew(
                    self.key, self.token, self.lock_timeout(), self.info
                ):
                    self.log(logging.WARNING, "lost_reservation")
                    raise _LostReservation(f"This {self.name} ran past LOCK_TIMEOUT.")
        except _LostReservation as exc:
            # Another delivery owns the key now, and runs the task: ours rolled back.
            self.stop_heartbeat()
            raise TaskInProgress(str(exc)) from exc
        except BaseException:
            if ran.committed:
                self.complete_ran(ran)
            else:
                self.release(None, "exception")
            raise
        if not in_callers_transaction:
            self.complete_ran(ran)
        # Called inside its caller's transaction, the work commits with it and the
        # result is stored then; rolled back, it keeps the key until LOCK_TIMEOUT.
        assert ran.stored is not None
        return json.loads(ran.stored.body)  # type: ignore[no-any-return]

    def complete_ran(self, ran: _Ran) -> None:
        """Store what the work that committed answered, or that its answer is not kept.

        A store that fails leaves the key held until LOCK_TIMEOUT: a duplicate then runs.
        """
        self.complete(ran.stored or NOT_STORED)

    def transaction(self, alias: str) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        if not self.atomic:
            return contextlib.nullcontext
        return functools.partial(transaction.atomic, using=alias)

    def stored(self, result: Any) -> StoredResponse:
        try:
            body = json.dumps(result).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{self.name} returned {type(result).__name__}, which is not JSON: "
                "an idempotent task's result is stored for its duplicates."
            ) from exc
        return StoredResponse(status=200, headers=(), body=body)

    def send(self, signal: Signal, **kwargs: Any) -> None:
        """The signals are a request's (their receivers get it): a task sends none."""

    def log(self, level: int, event: str, **fields: Any) -> None:
        """The task's name and the key's digest: never the key or the arguments."""
        if logger.isEnabledFor(level):
            # A task's result has no HTTP status: its StoredResponse's is a placeholder.
            fields.pop("status", None)
            fields = {"event": event, "task": self.name, "key_digest": self.digest, **fields}
            line = " ".join(f"{field}={value}" for field, value in fields.items())
            logger.log(level, "idempotency %s", line, extra={"idempotency": fields})


def fingerprint(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """SHA-256 of the task's name and its arguments as canonical JSON."""
    try:
        canonical = json.dumps(
            [name, list(args), kwargs], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}'s arguments are not JSON: they cannot be fingerprinted.") from exc
    return hashlib.sha256(canonical.encode()).hexdigest()


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
