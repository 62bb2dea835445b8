"""What does one request cost in process, how close to the floor, what is the library's own Python?

    python benchmarks/inprocess.py                      # SQLite, PostgreSQL, MariaDB, Redis, memory
    python benchmarks/inprocess.py --stores postgres,postgres_encrypted   # ENCRYPTION_KEY's cost
    python benchmarks/inprocess.py --before /tmp/old --before-python /tmp/venv/bin/python
    python benchmarks/inprocess.py --stores postgres,postgres_prepared   # prepared statements
    python benchmarks/inprocess.py --stores postgres_atomic   # every view in a transaction
    python benchmarks/inprocess.py --stores memory --profile   # the library's calls, counted

A bare view, a first request and a replay per pass (Django's test client), on PostgreSQL
the floor too; each store also with its stored responses encrypted ("<store>_encrypted");
--before alternates another checkout with this one. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import common

Results = dict[tuple[str, str], list[dict[str, Any]]]  # (code, store): each process's medians
#: Issue 36's target for --profile: the library's calls per keyed first request.
MAX_CALLS = 40
#: The in-memory store, which --before's checkout needs for "memory".
MEMORY_STORE = Path("idempotency_django/stores/memory.py")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measured process: per pass, each scenario once (in a new order) and the floor."""
    common.setup_django()
    requests = common.scenario_requests()
    timed = {name: timing(send) for name, send in requests.items()}
    if args.floor:
        # The floor's statements around a bare request, where a first request sends them:
        # by psycopg alone (the floor), through Django's cursor, and through the store.
        for name, send in IN_PLACE.items():
            timed[name] = send(requests["bare"])
    floor = statement_floor() if args.floor else None
    samples: dict[str, list[float]] = {name: [] for name in (*timed, "floor")}
    order, shuffle = list(timed), random.Random(0).shuffle
    for index in range(args.warmup + args.n):
        # What ran just before a request changes its time (caches) by up to
        # 0.1 ms: no scenario may always follow the same one.
        shuffle(order)
        for name in order:
            elapsed = timed[name](index)
            if index >= args.warmup:
                samples[name].append(elapsed / 1e6)
        if floor is not None:
            elapsed = floor(index)
            if index >= args.warmup:
                samples["floor"].append(elapsed / 1e6)
    result: dict[str, Any] = {name: common.median(values) for name, values in samples.items()}
    # Per pass, so that slow phases of the machine cancel out.
    pairs = zip(samples["first"], samples["bare"], strict=True)
    result["first_minus_bare"] = common.median([first - bare for first, bare in pairs])
    for name in IN_PLACE if args.floor else ():
        pairs = zip(samples[name], samples["bare"], strict=True)
        result[f"{name}_minus_bare"] = common.median([both - bare for both, bare in pairs])
    if args.profile:
        unused = range(args.warmup + args.n, args.warmup + 2 * args.n)  # keys no pass sent
        result["calls"], result["profile"] = profile(requests["first"], unused)
    return result


def timing(send: Any) -> Any:
    """``send`` (index -> status 201) as a function of index -> its nanoseconds."""

    def timed(index: int) -> int:
        started = time.perf_counter_ns()
        status = send(index)
        elapsed = time.perf_counter_ns() - started
        assert status == 201, status
        return elapsed

    return timed


#: The reservation's and the answer's seconds in the floor's and the store's statements.
FLOOR_SECONDS = 3600


def floor_record() -> tuple[Any, Any]:
    """The request and the answer whose record the floor and the store's calls write: one
    pair for both, so that the two figures always measure the same record."""
    from idempotency_django.stores import RequestInfo, StoredResponse

    request = RequestInfo(method="POST", path=common.PROTECTED_PATH, fingerprint="f" * 64)
    stored = StoredResponse(201, (("Content-Type", "application/json"),), common.BODY.encode())
    return request, stored


def floor_key() -> Any:
    """A new key of the floor's records (no request's scope has them)."""
    from idempotency_django.stores import RecordKey

    return RecordKey("floor", "", uuid.uuid4().hex)


def statement_floor(through_django: bool = False, around: Any = None) -> Any:
    """A function of index sending a first request's two statements, as the store builds
    them; it returns their nanoseconds.

    By psycopg alone, or ``through_django``'s cursor, as the store sends them: what
    Django's own layer (its cursor wrapper, execute wrappers, error translation) adds.
    ``around``, a request (index -> status): sent between the two, where a first
    request's view runs, and timed with them. Sent back to back, the two commits
    cost 0.03 to 0.15 ms less than around a view's own commit (2026-12-06,
    docs/benchmarks-results.md): a first request cannot send them so, and the floor
    ``around`` the bare view is the one the target is judged against.
    """
    from django.db import connection

    from idempotency_django.stores import database_sql

    connection.ensure_connection()
    raw, sql = connection.connection, database_sql.statements(connection)
    request, stored = floor_record()

    def django_execute(statement: str, params: list[Any]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)

    execute = django_execute if through_django else raw.execute

    def send(index: int = 0) -> int:
        key, token = floor_key(), uuid.uuid4().hex
        insert = database_sql.insert_values(connection, key, request, token, FLOOR_SECONDS)
        completed = [*database_sql.response_values(stored), FLOOR_SECONDS]
        started = time.perf_counter_ns()
        execute(sql.insert_or_nothing, insert)
        if around is not None:
            assert around(index) == 201
        execute(sql.complete, [*completed, key.digest, token, database_sql.IN_PROGRESS])
        return time.perf_counter_ns() - started

    return send


def store_calls(around: Any) -> Any:
    """A function of index: the store's ``claim``, ``around`` (a request), the store's
    ``complete``, as a first request calls them; it returns their nanoseconds. Beyond
    :func:`statement_floor` through Django's cursor: the store's own Python."""
    from idempotency_django.stores import get_store

    store = get_store()
    request, stored = floor_record()

    def send(index: int) -> int:
        key = floor_key()
        started = time.perf_counter_ns()
        claim = store.claim(key, request, FLOOR_SECONDS)
        assert around(index) == 201
        store.complete(key, claim.token, stored, FLOOR_SECONDS, request=request)
        return time.perf_counter_ns() - started

    return send


#: PostgreSQL's two statements around a bare request: by psycopg alone (the floor),
#: through Django's cursor, through the store (its Python too).
IN_PLACE = {
    "floor_in_place": lambda around: statement_floor(around=around),
    "django_in_place": lambda around: statement_floor(through_django=True, around=around),
    "store_in_place": store_calls,
}


def profile(send: Any, indexes: range) -> tuple[float, list[str]]:
    """The calls into the library per first request, and its functions by own time
    per first request (microseconds), top 15.

    The count is deterministic where the times are not: every call of a function of
    the package (a generator's every resumption included, as cProfile counts them).
    """
    profiler = cProfile.Profile()
    profiler.enable()
    for index in indexes:
        send(index)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    library = {
        where: figures
        for where, figures in stats.items()
        if "/idempotency_django/" in Path(where[0]).as_posix()
    }
    n = len(indexes)
    calls = sum(figures[1] for figures in library.values()) / n
    rows = [
        (own / n * 1e6, cum / n * 1e6, count / n, f"{Path(file).name}:{line}({name})")
        for (file, line, name), (_cc, count, own, cum, _callers) in library.items()
    ]
    rows.sort(reverse=True)
    return calls, [f"own {o:6.1f} us  cum {c:6.1f} us  x{k:.0f}  {f}" for o, c, k, f in rows[:15]]


def measure(args: argparse.Namespace) -> None:
    """Processes per store in turn (this checkout and --before's), then the report."""
    os.environ["BENCH_PREPARE_THRESHOLD"] = str(args.prepare_threshold)  # passed on
    common.reset_databases()
    codes = {"after": (common.ROOT, "")}
    if args.before:
        codes = {"before": (Path(args.before), args.before_python), **codes}
    results: Results = defaultdict(list)
    for round_ in range(args.rounds):
        for store in args.stores.split(","):
            for label, (code, python) in codes.items():
                if label == "before" and (
                    "_encrypted" in store
                    or (store.startswith("memory") and not (code / MEMORY_STORE).exists())
                ):
                    continue  # what the other checkout cannot measure
                arguments = ["-n", str(args.n), "--warmup", str(args.warmup)]
                if store in ("postgres", "postgres_prepared") and label == "after":
                    arguments.append("--floor")
                if args.profile and store == "memory" and round_ == 0:
                    arguments.append("--profile")
                result = common.run_child(
                    "inprocess.py", store, *arguments, code=code, python=python
                )
                results[(label, store)].append(result)
                times = ", ".join(
                    f"{name} {result[name]:.3f} ms"
                    for name in (*common.SCENARIOS, "floor", "floor_in_place_minus_bare")
                    if name in result
                )
                print(f"  round {round_ + 1} {label} {store}: {times}")
    report(results)


def report(results: Results) -> None:
    def ratio(store: str, name: str, label: str = "after") -> float:
        """Over the processes of (label, store): the median of name's time / the bare view's."""
        return common.median([r[name] / r["bare"] for r in results[(label, store)]])

    def spread(store: str, name: str) -> str:
        """The lowest and the highest process of ("after", store): how near noise a verdict is."""
        values = [r[name] / r["bare"] for r in results[("after", store)]]
        return f"processes x{min(values):.3f} to x{max(values):.3f}"

    print("\nmedians over rounds, ratios to the bare view measured in the same process")
    rows = []
    for (label, store), measured in results.items():
        bare = common.median([r["bare"] for r in measured])
        figures = [f"x{ratio(store, name, label):.2f}" for name in ("first", "replay")]
        rows.append([label, common.STORE_LABELS[store], f"{bare:.3f} ms", *figures])
    common.table(["Code", "Store", "Bare view", "First request", "Replay"], rows)
    encrypted = [s for (label, s) in results if label == "after" and s.endswith("_encrypted")]
    for store in encrypted:
        plain = store.removesuffix("_encrypted")
        if ("after", plain) not in results:
            continue
        costs = []
        # The ratio's change, in the plain run's bare-view milliseconds.
        bare = common.median([r["bare"] for r in results[("after", plain)]])
        for name in ("first", "replay"):
            before, after = ratio(plain, name), ratio(store, name)
            extra = (after - before) * bare
            costs.append(f"{name} x{before:.2f} -> x{after:.2f} ({extra:+.3f} ms)")
        print(f"  encryption, {common.STORE_LABELS[plain]}: {'; '.join(costs)}")
    for (label, store), measured in results.items():
        for line in measured[0].get("profile", []):
            print(f"  cProfile, {label} {store}: {line}")
        if "calls" in measured[0]:
            calls = measured[0]["calls"]
            common.verdict(
                f"a keyed first request makes at most {MAX_CALLS} calls into the library, {store}",
                calls <= MAX_CALLS,
                f"{calls:.0f} calls (cProfile, a generator's resumptions included)",
            )
    if ("after", "postgres") in results and ("after", "postgres_prepared") in results:
        # Decision 3 of issue 36: what the project gains by preparing statements.
        for store in ("postgres", "postgres_prepared"):
            measured = results[("after", store)]
            added = common.median([r["first_minus_bare"] for r in measured])
            floor_ms = common.median([r["floor"] for r in measured])
            print(
                f"  {common.STORE_LABELS[store]}: first request x{ratio(store, 'first'):.2f}, "
                f"+{added:.3f} ms over the bare view; its two statements by psycopg "
                f"{floor_ms:.3f} ms; replay x{ratio(store, 'replay'):.2f}"
            )
    if ("after", "postgres") in results:
        # Judged per process, pass by pass: the first request less the bare view less
        # the floor (its two statements by psycopg around the bare view), against the
        # bare view; the target allows 10 %.
        beyond = [
            (r["first_minus_bare"] - r["floor_in_place_minus_bare"]) / r["bare"] * 100
            for r in results[("after", "postgres")]
        ]
        floor = 1 + ratio("postgres", "floor_in_place_minus_bare")
        back_to_back = 1 + ratio("postgres", "floor")
        common.verdict(
            "first request in process, PostgreSQL, at most the floor + 10 %",
            common.median(beyond) <= 10,
            f"{common.median(beyond):.1f} % of the bare view beyond the floor (processes "
            f"{min(beyond):.1f} to {max(beyond):.1f} %); first request "
            f"x{ratio('postgres', 'first'):.2f} ({spread('postgres', 'first')}), floor "
            f"x{floor:.2f} (the two statements back to back x{back_to_back:.2f})",
        )
        # Where the rest goes, per process: what the same statements cost beyond the floor
        # through Django's cursor, then through the store's Python, then the first request.
        steps = {}
        for name in ("floor_in_place", "django_in_place", "store_in_place", "first"):
            steps[name] = common.median(
                [r[f"{name}_minus_bare"] / r["bare"] * 100 for r in results[("after", "postgres")]]
            )
        print(
            f"  PostgreSQL, beyond the bare view: the floor {steps['floor_in_place']:.1f} %, "
            f"Django's cursor +{steps['django_in_place'] - steps['floor_in_place']:.1f} %, "
            f"the store's Python +{steps['store_in_place'] - steps['django_in_place']:.1f} %, "
            f"the rest of the library +{steps['first'] - steps['store_in_place']:.1f} % "
            "(of the bare view, medians over processes)"
        )
        if ("after", "postgres_async_claim") in results:
            # Its processes measure no floor: PostgreSQL's, by ratio to the bare view.
            first = ratio("postgres_async_claim", "first")
            common.verdict(
                "first request in process, PostgreSQL, async_claim_commit, at most the floor "
                "+ 10 %",
                first <= floor + 0.10,
                f"x{first:.2f} of the bare view ({spread('postgres_async_claim', 'first')}); "
                f"PostgreSQL's floor x{floor:.2f}, limit x{floor + 0.10:.2f}",
            )
    for (label, store), measured in results.items():
        if store.startswith("memory"):
            added = common.median([r["first_minus_bare"] for r in measured]) * 1000
            print(f"  the library's own Python, {label} {store}: {added:.0f} us per first request")
    for store in ("memory", "memory_quiet"):
        if ("after", store) in results:
            own = ratio(store, "first")
            common.verdict(
                f"the library's own Python at most x1.10 of the bare view, {store}",
                own <= 1.10,
                f"first request x{own:.3f} ({spread(store, 'first')}; "
                f"{common.STORE_LABELS[store]})",
            )
    for label, store in results:
        if label == "after" and not store.startswith("memory"):
            replay = ratio(store, "replay")
            target = f"a replay at most x0.85 of the bare view, {common.STORE_LABELS[store]}"
            common.verdict(target, replay <= 0.85, f"x{replay:.3f} ({spread(store, 'replay')})")


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile the library's functions")
    parser.add_argument("-n", type=int, default=300, help="passes per measured process")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="processes per store")
    parser.add_argument(
        "--stores",
        default="sqlite,postgres,mariadb,redis,memory,memory_quiet,"
        "sqlite_encrypted,postgres_encrypted,redis_encrypted,memory_encrypted",
    )
    parser.add_argument("--before", help="another checkout of the library to compare with")
    parser.add_argument(
        "--prepare-threshold",
        type=int,
        default=0,
        help="postgres_prepared: psycopg prepares a statement once it ran this many times",
    )
    parser.add_argument("--before-python", default="", help="the Python that runs --before")
    common.run(parser, measure, child)
