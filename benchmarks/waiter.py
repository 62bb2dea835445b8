"""What does a duplicate that waits (``WAIT_FOR_IN_PROGRESS``) cost the server?

    python benchmarks/waiter.py --hold 1.0 --waiters 4

While a first request holds its key for --hold seconds, duplicates arrive with
WAIT_FOR_IN_PROGRESS 0 and 10: per duplicate, the time its thread is held, its CPU, its
statements and its Redis commands (MONITOR). docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

import common


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measured process: per WAIT_FOR_IN_PROGRESS, a trial; per duplicate, medians."""
    common.setup_django()
    from django.conf import settings
    from django.test.utils import override_settings

    settings.EXAMPLE_BOOKING_DELAY_MS = int(args.hold * 1000)
    results: dict[str, Any] = {}
    for wait in (0, 10):
        options = {**settings.IDEMPOTENCY, "WAIT_FOR_IN_PROGRESS": wait}
        with override_settings(IDEMPOTENCY=options), RedisCommands() as commands:
            samples = trial(args.hold, args.waiters, commands)
        if wait and commands.by_name.get("evalsha"):
            # The first request's completion (one script) is not a duplicate's.
            commands.by_name["evalsha"] -= 1
        count = len(samples)
        results[str(wait)] = {
            "statuses": sorted({sample["status"] for sample in samples}),
            **{
                name: common.median([sample[name] for sample in samples])
                for name in ("seconds", "cpu_ms", "statements")
            },
            "redis_commands": sum(commands.by_name.values()) / count,
            "redis_by_name": {name: n / count for name, n in commands.by_name.items()},
        }
    return results


def trial(hold: float, waiters: int, commands: RedisCommands) -> list[dict[str, Any]]:
    """One first request holding a new key, and ``waiters`` duplicates: theirs costs."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    key = f"waiter-{uuid.uuid4().hex}"
    samples: list[dict[str, Any]] = []

    def post() -> int:
        client = Client(HTTP_AUTHORIZATION=common.AUTHORIZATION)
        status = common.client_post(client, common.PROTECTED_PATH, key)
        connection.close()
        return status

    def duplicate() -> None:
        started, cpu = time.monotonic(), time.thread_time()
        with CaptureQueriesContext(connection) as queries:
            status = post()
        seconds, cpu_ms = time.monotonic() - started, (time.thread_time() - cpu) * 1000
        statements = len(queries.captured_queries)
        samples.append(
            {"status": status, "seconds": seconds, "cpu_ms": cpu_ms, "statements": statements}
        )

    runner = threading.Thread(target=post)
    runner.start()
    time.sleep(min(0.2, hold / 4))  # the first request holds the key by now
    commands.start()
    threads = [threading.Thread(target=duplicate) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    commands.stop()
    runner.join()
    return samples


class RedisCommands:
    """Commands sent to the store's Redis database between start() and stop(), by MONITOR."""

    def __init__(self) -> None:
        import redis

        # The store's own URL: child_env leaves BENCH_REDIS_URL out of a measured process.
        self.server = redis.Redis.from_url(os.environ.get("REDIS_URL", common.REDIS_URL))
        self.database = self.server.connection_pool.connection_kwargs.get("db", 0)
        self.by_name: dict[str, int] = {}
        self.counting = False
        self.marker = f"bench-stop-{uuid.uuid4().hex}"

    def __enter__(self) -> RedisCommands:
        ready = threading.Event()
        self.thread = threading.Thread(target=self.watch, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(5)
        return self

    def watch(self, ready: threading.Event) -> None:
        with self.server.monitor() as monitor:
            ready.set()
            while True:
                command = monitor.next_command()
                if self.marker in command["command"]:
                    return
                top_level = command["client_type"] != "lua"
                if self.counting and top_level and int(command["db"]) == self.database:
                    name = command["command"].split(" ", 1)[0].lower()
                    self.by_name[name] = self.by_name.get(name, 0) + 1

    def start(self) -> None:
        time.sleep(0.05)
        self.counting = True

    def stop(self) -> None:
        time.sleep(0.05)  # MONITOR has seen the last commands by now
        self.counting = False

    def __exit__(self, *exc: object) -> None:
        self.server.echo(self.marker)
        self.thread.join(10)


def measure(args: argparse.Namespace) -> None:
    common.reset_databases()
    print(f"first request holds its key {args.hold:.1f} s; {args.waiters} duplicates")
    rows = []
    for store in ("postgres", "redis"):
        arguments = ["--hold", str(args.hold), "--waiters", str(args.waiters)]
        for wait, row in common.run_child("waiter.py", store, *arguments).items():
            redis = (
                f"{row['redis_commands']:.1f} {row['redis_by_name']}" if store == "redis" else ""
            )
            held, cpu = f"{row['seconds'] * 1000:.0f} ms", f"{row['cpu_ms']:.1f} ms"
            cells = [f"{wait} s", row["statuses"], held, cpu, f"{row['statements']:.0f}", redis]
            rows.append([common.STORE_LABELS[store], *cells])
    header = ["Store", "WAIT_FOR_IN_PROGRESS", "Answer", "Thread held", "CPU", "Statements"]
    common.table([*header, "Redis"], rows)


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--hold", type=float, default=1.0, help="seconds the first request runs")
    parser.add_argument("--waiters", type=int, default=4)
    common.run(parser, measure, child)
