"""Would one round trip per claim make a PostgreSQL replay cheaper, and at what cost?

    python benchmarks/claim_sql.py
    python benchmarks/claim_sql.py -n 600

The database store claims a key outside a transaction in up to two statements: its
``INSERT ... ON CONFLICT DO NOTHING``, then, when the key already had a row (a replay, a
conflict), its read of that row. Two shapes would answer both in one round trip, built
here from the store's own two statements:

- ``cte``: the INSERT in a data-modifying ``WITH``, whose query reads the row the INSERT
  found (PostgreSQL runs both on one snapshot: a row it inserted reads as none);
- ``one query``: the INSERT and the read sent as one string (psycopg's client-side
  binding, Django's default, sends it by the simple query protocol: one round trip, one
  implicit transaction, two results).

Per pass, in a new order each time, each shape claims a new key (a first request's
claim) and an existing one (a replay's), through Django's cursor as the store sends its
statements. Printed: each one's median and its ratio to the store's shape, measured in
the same process. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import common

SHAPES = ("store", "cte", "one query")


def child(args: argparse.Namespace) -> dict[str, Any]:
    common.setup_django()
    from django.db import connection

    from idempotency_django.stores import RecordKey, RequestInfo
    from idempotency_django.stores.database_sql import insert_values, statements

    sql = statements(connection)
    request = RequestInfo(method="POST", path=common.PROTECTED_PATH, fingerprint="f" * 64)
    run = uuid.uuid4().hex[:8]
    cte = (
        f"WITH claimed AS ({sql.insert_or_nothing} RETURNING 1) "
        "SELECT EXISTS (SELECT FROM claimed), existing.* "
        f"FROM (SELECT 1) AS one LEFT JOIN ({sql.read}) AS existing ON true"
    )
    one_query = f"{sql.insert_or_nothing}; {sql.read}"

    def store_shape(key: Any, params: list[Any], token: str) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(sql.insert_or_nothing, params)
            if cursor.rowcount:
                return True
            cursor.execute(sql.read, [key.digest])
            return bool(cursor.fetchone()[1] == token)

    def cte_shape(key: Any, params: list[Any], token: str) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(cte, [*params, key.digest])
            return bool(cursor.fetchone()[0])

    def one_query_shape(key: Any, params: list[Any], token: str) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(one_query, [*params, key.digest])
            cursor.cursor.nextset()  # the read's rows: ours when the INSERT made it
            return bool(cursor.fetchone()[1] == token)

    shapes: dict[str, Callable[[Any, list[Any], str], bool]] = {
        "store": store_shape,
        "cte": cte_shape,
        "one query": one_query_shape,
    }
    stored = RecordKey("bench:claim_sql", "", f"{run}-stored")
    with connection.cursor() as cursor:
        cursor.execute(sql.insert_or_nothing, insert_values(connection, stored, request, "", 3600))
    counter = iter(range(10**9))
    samples: dict[str, list[float]] = {f"{s} {k}": [] for s in SHAPES for k in ("first", "replay")}
    order, shuffle = list(samples), random.Random(0).shuffle
    for index in range(args.warmup + args.n):
        shuffle(order)
        for name in order:
            shape, kind = name.rsplit(" ", 1)
            first = kind == "first"
            key = RecordKey("bench:claim_sql", "", f"{run}-{next(counter)}") if first else stored
            token = uuid.uuid4().hex
            params = insert_values(connection, key, request, token, 3600)
            started = time.perf_counter_ns()
            claimed = shapes[shape](key, params, token)
            elapsed = time.perf_counter_ns() - started
            assert claimed == first, (name, claimed)
            if index >= args.warmup:
                samples[name].append(elapsed / 1e6)
    return {name: common.median(values) for name, values in samples.items()}


def measure(args: argparse.Namespace) -> None:
    common.reset_databases()
    medians = common.run_child(
        "claim_sql.py", "postgres", "-n", str(args.n), "--warmup", str(args.warmup)
    )
    rows = []
    for shape in SHAPES:
        first, replay = medians[f"{shape} first"], medians[f"{shape} replay"]
        rows.append(
            [
                shape,
                f"{first:.3f} (x{first / medians['store first']:.2f})",
                f"{replay:.3f} (x{replay / medians['store replay']:.2f})",
            ]
        )
    common.table(["Claim's SQL, PostgreSQL", "new key (ms, x store)", "stored key"], rows)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("-n", type=int, default=400, help="measured passes")
    parser.add_argument("--warmup", type=int, default=40)
    common.run(parser, measure, child)


if __name__ == "__main__":
    main()
