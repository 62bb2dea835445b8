"""What does ``@idempotent_task`` add to a background task, per store?

    python benchmarks/tasks.py                          # SQLite, PostgreSQL, Redis, memory
    python benchmarks/tasks.py --stores postgres -n 2000

The task writes one WebhookRun row (the example project's) and returns its id. Per pass,
in a new order each time: the bare function, the same function under @idempotent_task
with a new key (it runs: claim, write, store the result) and with a key already
completed (it returns the stored result). Prints each one's median and its ratio to the
bare task, measured in the same process. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from typing import Any

import common

SCENARIOS = ("bare", "first", "replay")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measured process: medians in milliseconds of each scenario."""
    common.setup_django()
    from bookings.models import WebhookRun
    from idempotency_django.tasks import idempotent_task

    def record(event: str) -> int:
        return WebhookRun.objects.create(event=event).pk

    once = idempotent_task(record, name="bench.record")
    run, counter = uuid.uuid4().hex[:8], iter(range(10**9))
    once("replayed", idempotency_key=f"replay-{run}")
    calls = {
        "bare": lambda: record("bare"),
        "first": lambda: once("first", idempotency_key=f"first-{run}-{next(counter)}"),
        "replay": lambda: once("replayed", idempotency_key=f"replay-{run}"),
    }
    samples: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    order, shuffle = list(calls), random.Random(0).shuffle
    for index in range(args.warmup + args.n):
        shuffle(order)  # no scenario always follows the same one
        for name in order:
            started = time.perf_counter_ns()
            calls[name]()
            elapsed = time.perf_counter_ns() - started
            if index >= args.warmup:
                samples[name].append(elapsed / 1e6)
    return {name: common.median(values) for name, values in samples.items()}


def measure(args: argparse.Namespace) -> None:
    common.reset_databases()
    rows = []
    for store in args.stores.split(","):
        medians = common.run_child(
            "tasks.py", store, "-n", str(args.n), "--warmup", str(args.warmup)
        )
        bare = medians["bare"]
        rows.append(
            [
                common.STORE_LABELS[store],
                f"{bare:.3f}",
                f"{medians['first']:.3f} ({medians['first'] / bare:.1f}x)",
                f"{medians['replay']:.3f} ({medians['replay'] / bare:.1f}x)",
            ]
        )
    common.table(
        ["Store", "bare task (ms)", "first delivery (ms, x bare)", "duplicate (ms, x bare)"], rows
    )


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--stores", default="sqlite,postgres,redis,memory")
    parser.add_argument("-n", type=int, default=1000, help="measured passes")
    parser.add_argument("--warmup", type=int, default=100)
    common.run(parser, measure, child)


if __name__ == "__main__":
    main()
