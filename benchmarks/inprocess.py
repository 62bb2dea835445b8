"""In-process scenarios for one store, through the full middleware stack (Django's test Client).

Run by ``overhead.py`` in a child process whose environment selects the store
(see ``_bench.child_env``); writes its results as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _bench

SCENARIOS = ("bare", "nokey", "first", "replay", "reuse", "in_progress")
SLOW_SCENARIOS = ("bare_slow", "first_slow", "replay_slow")
SLOW_DELAY_MS = 20


def make_requester() -> Any:
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=_bench.AUTHORIZATION)
    run_id = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def post(path: str, body: str, key: str | None) -> Any:
        headers = {"X-Location-Id": _bench.LOCATION}
        if key is not None:
            headers["Idempotency-Key"] = key
        return client.post(path, data=body, content_type="application/json", headers=headers)

    def fresh_key() -> str:
        return f"first-{run_id}-{next(counter)}"

    replay_key = f"replay-{run_id}"
    progress_key = f"in-progress-{run_id}"

    requests = {
        "bare": lambda: post(_bench.BARE_PATH, _bench.BODY, fresh_key()),
        "nokey": lambda: post(_bench.PROTECTED_PATH, _bench.BODY, None),
        "first": lambda: post(_bench.PROTECTED_PATH, _bench.BODY, fresh_key()),
        "replay": lambda: post(_bench.PROTECTED_PATH, _bench.BODY, replay_key),
        "reuse": lambda: post(_bench.PROTECTED_PATH, _bench.OTHER_BODY, replay_key),
        "in_progress": lambda: post(_bench.PROTECTED_PATH, _bench.BODY, progress_key),
    }
    requests["bare_slow"] = requests["bare"]
    requests["first_slow"] = requests["first"]
    requests["replay_slow"] = requests["replay"]
    expected = {
        "bare": 201,
        "nokey": 201,
        "first": 201,
        "replay": 201,
        "reuse": 409,
        "in_progress": 409,
        "bare_slow": 201,
        "first_slow": 201,
        "replay_slow": 201,
    }

    # Prime the replayed key, and pre-create a reservation nobody completes.
    primed = post(_bench.PROTECTED_PATH, _bench.BODY, replay_key)
    assert primed.status_code == 201, primed.content
    reserve_in_progress(progress_key)
    return requests, expected


def reserve_in_progress(key: str) -> None:
    from django.contrib.auth import get_user_model

    from idempotency_django.fingerprint import default_fingerprint
    from idempotency_django.scope import principal_of
    from idempotency_django.stores import Outcome, RecordKey, RequestInfo, get_store

    user = get_user_model().objects.get(username=_bench.USERNAME)
    principal = principal_of(user)
    assert principal is not None

    class FakeRequest:
        method = "POST"
        body = _bench.BODY.encode()

        def get_full_path(self) -> str:
            return _bench.PROTECTED_PATH

    info = RequestInfo(
        method="POST",
        path=_bench.PROTECTED_PATH,
        fingerprint=default_fingerprint(FakeRequest()),  # type: ignore[arg-type]
    )
    claim = get_store().claim(RecordKey(principal, _bench.LOCATION, key), info, 3600)
    assert claim.outcome is Outcome.CLAIMED


def measure(
    requests: dict[str, Any], expected: dict[str, int], names: tuple[str, ...], n: int, warmup: int
) -> dict[str, list[int]]:
    """Round-robin: one request of each scenario per pass, so noise hits all of them alike."""
    samples: dict[str, list[int]] = {name: [] for name in names}
    for index in range(warmup + n):
        for name in names:
            started = time.perf_counter_ns()
            response = requests[name]()
            elapsed = time.perf_counter_ns() - started
            if response.status_code != expected[name]:
                raise SystemExit(f"{name}: {response.status_code} {response.content[:300]!r}")
            if index >= warmup:
                samples[name].append(elapsed)
    return samples


def count_queries(requests: dict[str, Any]) -> dict[str, Any]:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext
    from django.utils.connection import ConnectionDoesNotExist

    from idempotency_django.stores.database import SIDE_ALIAS_SUFFIX

    aliases = ["default"]
    try:  # the autocommit side connection claims use under ATOMIC_REQUESTS
        connections["default" + SIDE_ALIAS_SUFFIX]
        aliases.append("default" + SIDE_ALIAS_SUFFIX)
    except ConnectionDoesNotExist:
        pass
    counts: dict[str, Any] = {}
    for name in SCENARIOS:
        with contextlib.ExitStack() as stack:
            captured = [
                stack.enter_context(CaptureQueriesContext(connections[alias])) for alias in aliases
            ]
            requests[name]()
        sql = [
            f"[{alias}] {query['sql'][:150]}"
            for alias, capture in zip(aliases, captured, strict=True)
            for query in capture.captured_queries
        ]
        counts[name] = {"count": len(sql), "sql": sql}
    return counts


def count_redis_commands(requests: dict[str, Any], repeat: int = 20) -> dict[str, Any]:
    """Round trips to Redis per request, seen by ``MONITOR`` in a thread.

    Commands a Lua script runs (``[14 lua]`` in MONITOR) are part of the
    script's round trip and counted apart; so are the ``INFO commandstats``
    deltas, which include them.
    """
    import threading

    import redis

    server = redis.Redis.from_url(_bench.REDIS_URL)
    database = server.connection_pool.connection_kwargs.get("db", 0)
    counts: dict[str, Any] = {}
    for name in ("first", "replay", "reuse", "in_progress"):
        requests[name]()  # scripts loaded, connections open
        marker = f"bench-monitor-stop-{uuid.uuid4().hex}"
        seen: list[dict[str, Any]] = []
        ready = threading.Event()

        stopper = redis.Redis.from_url(_bench.REDIS_URL)
        stopper.ping()  # connected (and SELECTed) before MONITOR starts

        def watch(
            marker: str = marker, seen: list[dict[str, Any]] = seen, ready: Any = ready
        ) -> None:
            with server.monitor() as monitor:
                ready.set()
                while True:
                    command = monitor.next_command()
                    if marker in command["command"]:
                        return
                    if int(command["db"]) == database:
                        seen.append(command)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        ready.wait(5)
        time.sleep(0.2)
        for _ in range(repeat):
            requests[name]()
        stopper.echo(marker)
        thread.join(10)
        top = [c["command"].split(" ", 1)[0].lower() for c in seen if c["client_type"] != "lua"]
        nested = [c["command"].split(" ", 1)[0].lower() for c in seen if c["client_type"] == "lua"]
        counts[name] = {
            "round_trips": len(top) / repeat,
            "commands": {cmd: top.count(cmd) / repeat for cmd in sorted(set(top))},
            "inside_scripts": {cmd: nested.count(cmd) / repeat for cmd in sorted(set(nested))},
        }
    return counts


def replay_side_effects(requests: dict[str, Any], repeat: int = 100) -> dict[str, Any]:
    """What a replay leaves behind on PostgreSQL: the claim's failed INSERT burns an id."""
    from django.db import connection

    def last_id() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT last_value FROM pg_sequences "
                "WHERE sequencename = 'idempotency_django_idempotencyrecord_id_seq'"
            )
            return int(cursor.fetchone()[0])

    before = last_id()
    for _ in range(repeat):
        requests["replay"]()
    return {"ids_consumed_per_replay": (last_id() - before) / repeat}


def statement_floor(n: int) -> dict[str, Any]:
    """The library's own first-request statements, sent by psycopg alone.

    The claim (the reservation's INSERT) and the completion's UPDATE, exactly as
    the database store sends them, on this process's connection in autocommit mode, with
    no ORM, no Django and no library code around them: what the target's "+1
    round trip for the reservation, +1 for the completion" costs at least on
    this server, before any Python of the library runs.
    """
    from django.db import connection
    from django.utils import timezone

    from idempotency_django.models import IdempotencyRecord
    from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse, database

    connection.ensure_connection()
    raw = connection.connection
    statements = database._statements(connection)
    assert statements.claim_unflushed is not None and connection.get_autocommit()
    claims: list[int] = []
    completions: list[int] = []
    selects: list[int] = []
    durable_claims: list[int] = []  # the same INSERT, its commit waiting for the disk
    request = RequestInfo(method="POST", path=_bench.PROTECTED_PATH, fingerprint="f" * 64)
    response = StoredResponse(
        status=201, headers=(("Content-Type", "application/json"),), body=_bench.BODY.encode()
    )
    token = "t" * 32
    for index in range(n + 20):
        now = timezone.now()
        key, other_key = (RecordKey("floor", "", f"floor-{uuid.uuid4().hex}") for _ in "ab")
        fields = database._reservation_fields(request, token, now, 60)
        insert = database._insert_params(connection, key, fields)
        durable = database._insert_params(connection, other_key, fields)
        completed = database._completion_fields(response, now, 60)
        update = database._complete_params(connection, key, token, completed)
        started = time.perf_counter_ns()
        raw.execute(statements.claim_unflushed, insert).fetchone()
        claimed = time.perf_counter_ns()
        raw.execute(statements.complete, update)
        done = time.perf_counter_ns()
        raw.execute("SELECT 1").fetchone()
        selected = time.perf_counter_ns()
        assert statements.claim is not None
        raw.execute(statements.claim, durable).fetchone()
        waited = time.perf_counter_ns()
        if index >= 20:
            claims.append(claimed - started)
            completions.append(done - claimed)
            selects.append(selected - done)
            durable_claims.append(waited - selected)
    IdempotencyRecord.objects.filter(principal="floor").delete()
    return {
        "claim": _bench.summarize(claims),
        "complete": _bench.summarize(completions),
        "select_1": _bench.summarize(selects),
        "claim_durable": _bench.summarize(durable_claims),
    }


def profile(requests: dict[str, Any], n: int) -> dict[str, Any]:
    """cProfile of ``n`` requests per scenario: the library's own functions, per request."""
    report: dict[str, Any] = {}
    for name in ("bare", "first", "replay"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            requests[name]()
        profiler.disable()
        stats = pstats.Stats(profiler)
        total = stats.total_tt  # type: ignore[attr-defined]
        rows = []
        for (filename, line, function), stat in stats.stats.items():  # type: ignore[attr-defined]
            _cc, calls, tottime, cumtime, _callers = stat
            if "idempotency_django" not in filename and not _interesting(filename, function):
                continue
            rows.append(
                {
                    "function": f"{_short(filename)}:{line}({function})",
                    "calls_per_request": calls / n,
                    "cum_us": cumtime / n * 1e6,
                    "own_us": tottime / n * 1e6,
                }
            )
        rows.sort(key=lambda row: row["cum_us"], reverse=True)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(
            "idempotency_django", 25
        )
        report[name] = {
            "total_us_per_request": total / n * 1e6,
            "rows": rows[:40],
            "text": text.getvalue(),
        }
    return report


#: Functions outside the library that show where its time goes: the driver waiting
#: for the server, the ORM building statements, logging, signals, hashing, JSON.
EXTERNAL = {
    ("psycopg/connection.py", "wait"),
    ("django/db/models/sql/compiler.py", "execute_sql"),
    ("django/db/models/sql/compiler.py", "as_sql"),
    ("django/db/models/base.py", "save_base"),
    ("django/db/models/base.py", "__init__"),
    ("django/db/models/query.py", "update"),
    ("django/db/models/query.py", "first"),
    ("django/db/utils.py", "__exit__"),
    ("logging/__init__.py", "_log"),
    ("django/dispatch/dispatcher.py", "send"),
    ("redis/commands/core.py", "__call__"),
    ("uuid.py", "uuid4"),
    ("json/__init__.py", "loads"),
    ("json/__init__.py", "dumps"),
}


def _interesting(filename: str, function: str) -> bool:
    if function.startswith("<") and ("sha256" in function or "hexdigest" in function):
        return True
    return any(filename.endswith(path) and function == name for path, name in EXTERNAL)


def _short(filename: str) -> str:
    for marker in ("idempotency_django/", "site-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename.rsplit("/", 1)[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True, choices=sorted(_bench.STORES))
    parser.add_argument("--out", required=True)
    parser.add_argument("-n", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--slow-n", type=int, default=40)
    parser.add_argument("--profile-n", type=int, default=0)
    args = parser.parse_args()

    _bench.setup_django()
    from django.conf import settings

    requests, expected = make_requester()
    result: dict[str, Any] = {"store": args.store}
    samples = measure(requests, expected, SCENARIOS, args.n, args.warmup)
    result["latency"] = {name: _bench.summarize(values) for name, values in samples.items()}

    # Replay against running the view with a realistic cost (the view sleeps).
    settings.EXAMPLE_BOOKING_DELAY_MS = SLOW_DELAY_MS
    slow = measure(requests, expected, SLOW_SCENARIOS, args.slow_n, 5)
    settings.EXAMPLE_BOOKING_DELAY_MS = 0
    result["slow_delay_ms"] = SLOW_DELAY_MS
    result["latency"].update({name: _bench.summarize(values) for name, values in slow.items()})
    # A replay never runs the view, so its cost does not depend on the delay: all of
    # this run's replay samples together are less sensitive to one noisy phase.
    result["latency"]["replay_all"] = _bench.summarize(samples["replay"] + slow["replay_slow"])

    result["queries"] = count_queries(requests)
    if args.store == "redis":
        result["redis_commands"] = count_redis_commands(requests)
    if args.store.startswith("postgres") and args.store != "postgres_memory":
        result["replay_side_effects"] = replay_side_effects(requests)
    if args.store == "postgres":
        result["statement_floor"] = statement_floor(args.n)
    if args.profile_n:
        result["profile"] = profile(requests, args.profile_n)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
