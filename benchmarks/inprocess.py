"""What does one request cost, in process, and how close is it to the floor?

    python benchmarks/inprocess.py                      # SQLite, PostgreSQL, Redis, memory
    python benchmarks/inprocess.py --before /tmp/old --before-python /tmp/venv/bin/python

The example's DRF booking-create view under ``@idempotent`` (``/api/bookings/``)
against the same viewset undecorated (``/bare/bookings/``), through the whole
middleware stack with Django's test client and HTTP Basic. Each measured
process sends, per pass, one request of each scenario (bare view, first
request with a new key, replay of one key), so noise hits them alike; a run is
several such processes per store, alternated, and every figure is a median of
their ratios. The scenarios' order changes every pass (what ran just before a
request changes its time).

On PostgreSQL each pass also sends the library's own first-request statements
(the claim's INSERT and the completion's UPDATE) by psycopg alone, with no
Django around them: the floor. The in-memory store (``bench_memory.py``) gives
the library's own Python: its first request minus its bare view.
``--before`` measures another checkout of the library (with its own Python)
alternately with this one: the before/after of a change.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import common

SCENARIOS = ("bare", "first", "replay")


def child(args: argparse.Namespace) -> dict[str, Any]:
    common.setup_django()
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=common.AUTHORIZATION)
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def post(path: str, key: str | None) -> int:
        headers = {"X-Location-Id": "portland"}
        if key is not None:
            headers["Idempotency-Key"] = key
        response = client.post(
            path, data=common.BODY, content_type="application/json", headers=headers
        )
        return int(response.status_code)

    requests = {
        "bare": lambda: post(common.BARE_PATH, None),
        "first": lambda: post(common.PROTECTED_PATH, f"first-{run}-{next(counter)}"),
        "replay": lambda: post(common.PROTECTED_PATH, f"replay-{run}"),
    }
    floor = statement_floor() if args.floor else None
    samples: dict[str, list[float]] = {name: [] for name in (*SCENARIOS, "floor")}
    order = list(requests)
    shuffle = random.Random(0).shuffle
    for index in range(args.warmup + args.n):
        # What ran just before a request changes its time (caches) by up to
        # 0.1 ms: no scenario may always follow the same one.
        shuffle(order)
        for name in order:
            started = time.perf_counter_ns()
            status = requests[name]()
            elapsed = time.perf_counter_ns() - started
            assert status == 201, (name, status)
            if index >= args.warmup:
                samples[name].append(elapsed / 1e6)
        if floor is not None:
            elapsed = floor()
            if index >= args.warmup:
                samples["floor"].append(elapsed / 1e6)
    result: dict[str, Any] = {name: common.median(values) for name, values in samples.items()}
    # Per pass, so that slow phases of the machine cancel out.
    pairs = zip(samples["first"], samples["bare"], strict=True)
    result["first_minus_bare"] = common.median([first - bare for first, bare in pairs])
    if args.profile:
        result["profile"] = profile(requests["first"], args.n)
    return result


def statement_floor() -> Any:
    """A function sending a first request's two statements, as the store builds them."""
    from django.db import connection

    from idempotency_django.stores import RecordKey, RequestInfo, StoredResponse
    from idempotency_django.stores import database as db

    connection.ensure_connection()
    raw = connection.connection
    sql = db._statements(connection)
    request = RequestInfo(method="POST", path=common.PROTECTED_PATH, fingerprint="f" * 64)
    stored = StoredResponse(201, (("Content-Type", "application/json"),), common.BODY.encode())

    def send() -> int:
        key = RecordKey("floor", "", uuid.uuid4().hex)
        token = uuid.uuid4().hex
        insert = [*db._key_values(key), *db._request_values(request, token), 0, 3600]
        completed = [201, db._json(stored.headers), stored.body, False, 3600]
        started = time.perf_counter_ns()
        raw.execute(sql.insert_or_nothing, insert)
        raw.execute(sql.complete, [*completed, key.digest, token, db.IN_PROGRESS])
        return time.perf_counter_ns() - started

    return send


def profile(send: Any, n: int) -> list[str]:
    """The library's functions by own time per first request (microseconds), top 15."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        send()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        (own / n * 1e6, cum / n * 1e6, calls / n, f"{Path(file).name}:{line}({name})")
        for (file, line, name), (_cc, calls, own, cum, _callers) in stats.items()
        if "idempotency_django" in file
    ]
    rows.sort(reverse=True)
    return [f"own {o:6.1f} us  cum {c:6.1f} us  x{k:.0f}  {f}" for o, c, k, f in rows[:15]]


def measure(args: argparse.Namespace) -> int:
    common.reset_databases()
    codes = {"after": (common.ROOT, "")}
    if args.before:
        codes = {"before": (Path(args.before), args.before_python), **codes}
    stores = args.stores.split(",")
    ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
    raw: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        for store in stores:
            for label, (code, python) in codes.items():
                if label == "before" and store.startswith("memory"):
                    continue
                arguments = ["-n", str(args.n), "--warmup", str(args.warmup)]
                if store == "postgres" and label == "after":
                    arguments.append("--floor")
                if args.profile and store == "memory" and round_ == 0:
                    arguments.append("--profile")
                result = common.run_child(
                    "inprocess.py", store, *arguments, code=code, python=python
                )
                raw.setdefault((label, store), []).append(result)
                entry = ratios.setdefault((label, store), {})
                for name in ("first", "replay"):
                    entry.setdefault(name, []).append(result[name] / result["bare"])
                if result.get("floor") == result.get("floor"):  # not NaN
                    entry.setdefault("floor", []).append(1 + result["floor"] / result["bare"])
                entry.setdefault("library_ms", []).append(result["first_minus_bare"])
                print(f"  round {round_ + 1} {label} {store}: " + describe(result), flush=True)
    return report(ratios, raw, args)


def describe(result: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {result[name]:.3f} ms" for name in (*SCENARIOS, "floor") if name in result
    )


def report(ratios: Any, raw: Any, args: argparse.Namespace) -> int:
    print("\nmedian over rounds, ratios to the bare view measured in the same process")
    for (label, store), entry in ratios.items():
        bare = common.median([r["bare"] for r in raw[(label, store)]])
        print(
            f"  {label:6} {common.STORE_LABELS[store]:44} bare {bare:.3f} ms  "
            f"first x{common.median(entry['first']):.2f}  "
            f"replay x{common.median(entry['replay']):.2f}"
        )
        for line in raw[(label, store)][0].get("profile", []):
            print(f"        {line}")
    failed = 0
    postgres = ratios.get(("after", "postgres"))
    if postgres and postgres.get("floor"):
        first, floor = common.median(postgres["first"]), common.median(postgres["floor"])
        failed += not common.verdict(
            "first request in process, PostgreSQL, at most the floor + 10 %",
            first <= floor + 0.10,
            f"x{first:.2f} of the bare view; floor (its two statements by psycopg) "
            f"x{floor:.2f}, limit x{floor + 0.10:.2f}",
        )
    for store in ("memory", "memory_quiet"):
        if ("after", store) in ratios:
            own = common.median(ratios[("after", store)]["library_ms"])
            failed += not common.verdict(
                f"the library's own Python per first request at most 0.15 ms, {store}",
                own <= 0.15,
                f"{own:.3f} ms ({common.STORE_LABELS[store]}: first request minus bare view)",
            )
    for (label, store), entry in ratios.items():
        if label == "after" and not store.startswith("memory"):
            replay = common.median(entry["replay"])
            failed += not common.verdict(
                f"a replay costs at most the bare view, {common.STORE_LABELS[store]}",
                replay <= 1.0,
                f"x{replay:.2f}",
            )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile the library's functions")
    parser.add_argument("-n", type=int, default=300, help="passes per measured process")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="processes per store")
    parser.add_argument("--stores", default="sqlite,postgres,redis,memory,memory_quiet")
    parser.add_argument("--before", help="another checkout of the library to compare with")
    parser.add_argument("--before-python", default="", help="the Python that runs --before")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    measure(args)
    return 0  # a FAIL is a finding, not a crash


if __name__ == "__main__":
    sys.exit(main())
