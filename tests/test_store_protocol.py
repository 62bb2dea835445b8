"""A model of the store protocol, checked step by step against every real store.

Hypothesis drives three actors through claims, completions, releases and
renewals of one key while the key's expiry passes (``LOCK_TIMEOUT`` for a
reservation, ``RETENTION`` for a stored response) and expired entries are
purged. After every step the store must agree with a model that is a few
lines of plain Python:

* at most one actor owns the key at a time;
* an actor that lost the key (taken over after its expiry) can neither
  complete nor release it;
* a completed response never changes until it expires;
* a replay always returns the stored bytes.

On the database stores one more step forces the race a takeover must win
or lose cleanly: a retry reads an abandoned reservation, and before its
takeover UPDATE runs, the slow original completes. The takeover must then
fail and the retry replay the original's answer.
:func:`test_the_model_catches_a_token_only_takeover` shows the machine
catches the bug of 0.1, whose takeover compared the owner token only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores import (
    BaseStore,
    Outcome,
    RecordKey,
    RequestInfo,
    StoredResponse,
    database_sql,
    get_store,
)
from idempotency_django.stores import database as database_store
from idempotency_django.stores.redis import RedisStore
from tests.checkpoints import before_takeover
from tests.redis_helpers import raw_client, redis_store_settings

KEY = RecordKey(principal="auth.user:1", location="portland", key="booking-8891")
REQUEST = RequestInfo(method="POST", path="/bookings/", fingerprint="f" * 64)
LOCK_TIMEOUT = 300
RETENTION = 86400
ACTORS = ("a", "b", "c")
SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: For a test that the model catches a broken store: the same search on every run, and
#: room to reach the race (random searches of 40 examples missed it once in CI).
CATCHING = settings(SETTINGS, max_examples=400, derandomize=True, database=None)


@dataclasses.dataclass
class Entry:
    """What the store should hold for the key."""

    state: str  # "in_progress" or "completed"
    owner: str  # the actor whose claim made it
    token: str
    body: bytes = b""
    expired: bool = False


def response(body: bytes) -> StoredResponse:
    return StoredResponse(status=201, headers=(("Content-Type", "text/plain"),), body=body)


class StoreProtocol(RuleBasedStateMachine):
    """Subclassed per store with :attr:`store` set (see :func:`machine_for`)."""

    store: BaseStore

    def __init__(self) -> None:
        super().__init__()
        clear(self.store)
        self.entry: Entry | None = None
        #: The token of each actor's claim, while it has not finished.
        self.tokens: dict[str, str] = {}
        self.completions = 0

    # -- what a request does --

    @precondition(lambda self: len(self.tokens) < len(ACTORS))
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from([a for a in ACTORS if a not in self.tokens]))
        claim = self.store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        entry = self.entry
        if entry is None or entry.expired:
            assert claim.outcome is Outcome.CLAIMED, (claim, entry)
            self.entry = Entry("in_progress", actor, claim.token)
            self.tokens[actor] = claim.token
        elif entry.state == "in_progress":
            assert claim.outcome is Outcome.IN_PROGRESS, (claim, entry)
        else:
            assert claim.outcome is Outcome.REPLAY, (claim, entry)
            assert claim.response == response(entry.body)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from(sorted(self.tokens)))
        body = f"answer {self.completions} by {actor}".encode()
        self.completions += 1
        token = self.tokens.pop(actor)
        stored = self.store.complete(KEY, token, response(body), RETENTION, request=REQUEST)
        if self.owns(actor) or self.entry is None:
            # Ours (even past its expiry, as long as nobody took it over), or
            # gone without anyone claiming it since: the work ran, keep it.
            assert stored is True, self.entry
            self.entry = Entry("completed", actor, token, body)
        else:
            assert stored is False, self.entry

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from(sorted(self.tokens)))
        self.store.release(KEY, self.tokens.pop(actor))
        if self.owns(actor):
            self.entry = None

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from(sorted(self.tokens)))
        renewed = self.store.renew(KEY, self.tokens[actor], LOCK_TIMEOUT, REQUEST)
        if self.owns(actor) or self.entry is None:
            assert renewed is True, self.entry
            self.entry = Entry("in_progress", actor, self.tokens[actor])
        else:
            assert renewed is False, self.entry

    # -- what time and the operator do --

    @precondition(lambda self: self.entry is not None and not self.entry.expired)
    @rule()
    def expire(self) -> None:
        """The lock timeout (reservation) or the retention (response) passes."""
        assert self.entry is not None
        if isinstance(self.store, RedisStore):
            # Gone for every reader at once, as when its TTL runs out.
            assert raw_client().delete(self.store.redis_key(KEY)) == 1
            self.entry = None
        else:
            # Well behind the database's clock, whichever machine's clock that is.
            past = timezone.now() - timedelta(hours=1)
            assert IdempotencyRecord.objects.filter(digest=KEY.digest).update(expires_at=past)
            self.entry.expired = True

    @precondition(lambda self: self.entry is not None and self.entry.expired)
    @rule()
    def purge(self) -> None:
        """The purge command deletes expired rows (Redis needs none: its entries are gone)."""
        IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).delete()
        self.entry = None

    # -- the race a takeover must lose cleanly --

    @precondition(
        lambda self: (
            not isinstance(self.store, RedisStore)
            and self.entry is not None
            and self.entry.state == "in_progress"
            and self.entry.expired
            and self.entry.owner in self.tokens
            and len(self.tokens) < len(ACTORS)
        )
    )
    @rule(data=st.data())
    def retry_races_the_slow_original(self, data: st.DataObject) -> None:
        assert self.entry is not None
        original = self.entry.owner
        retry = data.draw(st.sampled_from([a for a in ACTORS if a not in self.tokens]))
        body = f"late answer by {original}".encode()
        token = self.tokens.pop(original)

        def original_completes_first() -> None:
            assert self.store.complete(KEY, token, response(body), RETENTION, request=REQUEST)

        with before_takeover(original_completes_first):
            claim = self.store.claim(KEY, REQUEST, LOCK_TIMEOUT)
        self.entry = Entry("completed", original, token, body)
        assert claim.outcome is Outcome.REPLAY, (retry, claim)
        assert claim.response == response(body)

    # -- after every step --

    @invariant()
    def the_store_agrees_with_the_model(self) -> None:
        expected = None
        if self.entry is not None and not self.entry.expired:
            expected = Outcome.REPLAY if self.entry.state == "completed" else Outcome.IN_PROGRESS
        assert self.store.peek(KEY) is expected, self.entry

    def owns(self, actor: str) -> bool:
        return (
            self.entry is not None
            and self.entry.state == "in_progress"
            and self.entry.owner == actor
            and self.entry.token == self.tokens.get(actor, self.entry.token)
        )


# -- per store --------------------------------------------------------------------


def clear(store: BaseStore) -> None:
    if isinstance(store, RedisStore):
        raw_client().flushdb()
    else:
        IdempotencyRecord.objects.all().delete()


def machine_for(store: BaseStore) -> type[StoreProtocol]:
    return type(f"StoreProtocol_{type(store).__name__}", (StoreProtocol,), {"store": store})


@pytest.fixture(
    params=[
        pytest.param("database", marks=pytest.mark.django_db),
        pytest.param("database-async-claims", marks=pytest.mark.django_db),
        "redis",
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[BaseStore]:
    if request.param == "database":
        with override_settings(IDEMPOTENCY={"STORE": "database"}):
            yield get_store()
    elif request.param == "database-async-claims":
        options = {"async_claim_commit": True}
        with override_settings(IDEMPOTENCY={"STORE": "database", "STORE_OPTIONS": options}):
            yield get_store()
    else:
        with redis_store_settings():
            yield get_store()


def test_every_store_follows_the_protocol(store: BaseStore) -> None:
    run_state_machine_as_test(machine_for(store), settings=SETTINGS)


@pytest.mark.django_db
def test_the_model_catches_a_token_only_takeover(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.1's takeover: ``UPDATE ... WHERE id = %s AND token = %s``, nothing else."""
    store = get_store()
    statements = database_sql.statements(connection)
    token = connection.ops.quote_name("token")
    token_only = statements.take_over.split(" AND ")[0] + f" AND {token} = %s"

    def token_only_take_over(
        connection: Any, row: Any, request: Any, token: str, lock: int, *, wait: bool = True
    ) -> bool:
        values = database_sql.request_values(request, token)
        params = [*values, *database_sql.later_params(connection, lock), row.pk, row.token]
        with connection.cursor() as cursor:
            cursor.execute(token_only, params)
            return bool(cursor.rowcount)

    monkeypatch.setattr(database_store, "_take_over", token_only_take_over)
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine_for(store), settings=CATCHING)
    # Caught where the race is: the retry took over a completed response.
    assert "retry_races_the_slow_original" in {entry.name for entry in failure.traceback}
