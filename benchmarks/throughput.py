"""How many requests per second, over HTTP, against the bare view?

    python benchmarks/throughput.py                  # 8 and 32 connections
    python benchmarks/throughput.py --connections 1,8 --seconds 3 --rounds 5

One gunicorn per configuration, side by side; wrk (wrk_post.lua) loads each one's bare
view, first requests and replays in turn, round after round. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import common

#: Stored keys the replays cycle through (one key replayed by many connections at
#: once is not what clients do).
REPLAY_KEYS = 48
Runs = dict[tuple[str, int], list[dict[str, float]]]  # (server, connections): requests/s


@dataclass
class Server:
    """One configuration under load: a gunicorn of its own."""

    label: str
    store: str
    env: dict[str, str] = field(default_factory=dict)
    path: str = common.PROTECTED_PATH
    python: str = ""
    base: str = ""  # once started: its URL, a session's headers, the keys it has stored
    headers: dict[str, str] = field(default_factory=dict)
    replay_keys: tuple[str, ...] = ()


def target_servers() -> list[Server]:
    """The configurations the targets are about: sessions where the store is.

    Without ``MAX_KEYS_PER_PRINCIPAL``: the one benchmark user sends thousands of new
    keys a second, past any limit, and its first requests would be measured as 429s.
    The count's cost is measured in process (``inprocess.py``, ``BENCH_MAX_KEYS``).
    """
    no_limit = {"BENCH_MAX_KEYS": "0"}
    atomic = {"EXAMPLE_ATOMIC_REQUESTS": "1", **no_limit}
    return [
        Server("database store (PostgreSQL)", "postgres", no_limit),
        Server("the same, async_claim_commit", "postgres_async_claim", no_limit),
        Server("database store (PostgreSQL), ATOMIC_REQUESTS", "postgres", atomic),
        Server("Redis store, sessions in Redis", "redis", {"BENCH_SESSIONS": "cache", **no_limit}),
    ]


@contextlib.contextmanager
def gunicorn(server: Server, port: int, workers: int) -> Iterator[None]:
    """gunicorn serving ``server``'s configuration on 127.0.0.1:``port``, for the block."""
    env, python = common.child_env(server.store, **server.env), server.python or sys.executable
    migrate = [python, "-c", "import common; common.setup_django()"]  # and create the user
    subprocess.run(migrate, env=env, check=True)
    command = [str(Path(python).with_name("gunicorn")), "django.core.wsgi:get_wsgi_application()"]
    command += [f"--workers={workers}", f"--bind=127.0.0.1:{port}"]
    command += ["--backlog=512", "--log-level=warning"]
    log = Path(f"/tmp/bench-gunicorn-{port}.log")
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    server.base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gunicorn did not start; see {log}")
            try:
                urllib.request.urlopen(f"{server.base}/ready/", timeout=2).read()
                break
            # TimeoutError too (a worker still booting), and a cut status line.
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def log_in(server: Server) -> None:
    """A session (``/bench-login/``: its cookie and CSRF header), and the replays' keys stored."""
    with urllib.request.urlopen(f"{server.base}/bench-login/", timeout=10) as response:
        token = response.read().decode()
        cookies = [value.split(";", 1)[0] for value in response.headers.get_all("Set-Cookie")]
    referer = server.base + "/"
    server.headers = {"Cookie": "; ".join(cookies), "X-CSRFToken": token, "Referer": referer}
    headers = {"Content-Type": "application/json", "X-Location-Id": "portland", **server.headers}
    server.replay_keys = tuple(str(uuid.uuid4()) for _ in range(REPLAY_KEYS))
    for key in server.replay_keys:
        body, sent = common.BODY.encode(), {**headers, "Idempotency-Key": key}
        request = urllib.request.Request(server.base + server.path, body, sent)
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201, (server.label, response.status)


def load(server: Server, mode: str, connections: int, seconds: float) -> float:
    """wrk on one scenario of ``server`` (``mode``: bare, first or replay): requests/s."""
    env = {
        **os.environ,
        "BENCH_MODE": mode,
        "BENCH_KEYS": ",".join(server.replay_keys),
        "BENCH_PREFIX": uuid.uuid4().hex[:8],
        "BENCH_HEADERS": "\n".join(f"{name}: {value}" for name, value in server.headers.items()),
    }
    url = server.base + (common.BARE_PATH if mode == "bare" else server.path)
    command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{round(seconds)}s"]
    command += ["--latency", "-s", str(common.BENCH_DIR / "wrk_post.lua"), url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    line = next(row for row in done.stdout.splitlines() if row.startswith("BENCH_JSON "))
    result = json.loads(line.removeprefix("BENCH_JSON "))
    bad = {status: n for status, n in result["statuses"].items() if not status.startswith("2")}
    if bad or result["errors"]:
        # A figure of refusals or errors is not the scenario's: stop, do not report it.
        raise SystemExit(f"{server.label} {mode}: {bad} errors {result['errors']}")
    return float(result["requests"] / (result["duration_us"] / 1e6))


def measure(servers: list[Server], args: argparse.Namespace) -> Runs:
    """Each round, each server's bare view, first requests and replays in turn."""
    runs: Runs = defaultdict(list)
    with contextlib.ExitStack() as stack:
        for offset, server in enumerate(servers):
            stack.enter_context(gunicorn(server, common.PORT + offset, args.workers))
            log_in(server)
        for round_ in range(args.rounds):
            for count in args.connections:
                for server in servers:
                    rps = {
                        name: load(server, name, count, args.seconds) for name in common.SCENARIOS
                    }
                    runs[(server.label, count)].append(rps)
                    figures = ", ".join(f"{name} {value:.0f}/s" for name, value in rps.items())
                    print(f"  round {round_ + 1}, {count:2} connections, {server.label}:", figures)
    return runs


def have_wrk(name: str) -> bool:
    if shutil.which("wrk"):
        return True
    print(f"SKIP  {name}: wrk is not installed (apt-get install wrk)")
    return False


#: Issue 36's targets over HTTP, against the bare view's requests per second.
FIRST_AT_LEAST, REPLAY_AT_LEAST = 0.80, 1.0


def report(runs: Runs) -> None:
    for (label, count), measured in runs.items():
        first, replay = common.ratio(measured, "first"), common.ratio(measured, "replay")
        bare = common.median([run["bare"] for run in measured])
        common.verdict(
            f"{count} connections, {label}: first >= x{FIRST_AT_LEAST:.2f}, "
            f"replay >= x{REPLAY_AT_LEAST:.1f}",
            first >= FIRST_AT_LEAST and replay >= REPLAY_AT_LEAST,
            f"bare {bare:.0f}/s, first x{first:.2f}, replay x{replay:.2f}",
        )


def measure_targets(args: argparse.Namespace) -> None:
    if have_wrk("throughput"):
        common.reset_databases()
        report(measure(target_servers(), args))


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--connections", type=common.integers, default="8,32")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    common.run(parser, measure_targets)
