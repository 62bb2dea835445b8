"""What does a duplicate that waits (``WAIT_FOR_IN_PROGRESS``) cost the server?

    python benchmarks/waiter.py --hold 1.0 --waiters 4

A first request whose view takes ``--hold`` seconds runs in one thread; once
it holds its key, ``--waiters`` duplicates are sent from threads of their own,
with ``WAIT_FOR_IN_PROGRESS`` at 0 (the immediate 409) and at 10 seconds
(wait, then replay). Per duplicate: how long it holds its thread (over HTTP,
a worker), the CPU its thread used, the statements it sent on its database
connection (database store) and the Redis commands it sent (Redis store, seen
by ``MONITOR`` on the benchmark's Redis database; the first request's own
completion is left out). Database store on PostgreSQL, autocommit (under a
transaction around the view a duplicate never waits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

import common


def child(args: argparse.Namespace) -> dict[str, Any]:
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
            "redis_commands": commands.count / count,
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
        headers = {"X-Location-Id": "portland", "Idempotency-Key": key}
        response = client.post(
            common.PROTECTED_PATH, common.BODY, content_type="application/json", headers=headers
        )
        connection.close()
        return int(response.status_code)

    def duplicate() -> None:
        started, cpu = time.monotonic(), time.thread_time()
        with CaptureQueriesContext(connection) as queries:
            status = post()
        samples.append(
            {
                "status": status,
                "seconds": time.monotonic() - started,
                "cpu_ms": (time.thread_time() - cpu) * 1000,
                "statements": len(queries.captured_queries),
            }
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
    """Commands sent to the benchmark's Redis database between start() and stop(), by MONITOR."""

    def __init__(self) -> None:
        import redis

        # The store's own URL: child_env leaves BENCH_REDIS_URL out of a measured process.
        self.server = redis.Redis.from_url(os.environ.get("REDIS_URL", common.REDIS_URL))
        self.database = self.server.connection_pool.connection_kwargs.get("db", 0)
        self.by_name: dict[str, int] = {}
        self.counting = False
        self.marker = f"bench-stop-{uuid.uuid4().hex}"

    @property
    def count(self) -> int:
        return sum(self.by_name.values())

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
        time.sleep(0.05)
        self.counting = False

    def __exit__(self, *exc: object) -> None:
        self.server.echo(self.marker)
        self.thread.join(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hold", type=float, default=1.0, help="seconds the first request runs")
    parser.add_argument("--waiters", type=int, default=4)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    common.reset_databases()
    print(f"first request holds its key {args.hold:.1f} s; {args.waiters} duplicates")
    print("| Store | WAIT_FOR_IN_PROGRESS | Answer | Thread held | CPU | Statements | Redis |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for store in ("postgres", "redis"):
        arguments = ["--hold", str(args.hold), "--waiters", str(args.waiters)]
        result = common.run_child("waiter.py", store, *arguments)
        for wait, row in result.items():
            redis = f"{row['redis_commands']:.1f} {row['redis_by_name']}"
            redis = redis if store == "redis" else ""
            statements = f"{row['statements']:.0f}"
            print(
                f"| {common.STORE_LABELS[store]} | {wait} s | {row['statuses']} "
                f"| {row['seconds'] * 1000:.0f} ms | {row['cpu_ms']:.1f} ms | {statements} "
                f"| {redis} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
