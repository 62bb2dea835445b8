"""How many requests per second, over HTTP, against the bare view?

    python benchmarks/throughput.py                  # 8 and 32 connections
    python benchmarks/throughput.py --connections 1,8 --seconds 3 --rounds 5

gunicorn (sync workers) serves the benchmark project; ``wrk`` posts the
booking body, session-authenticated (a session cookie and the CSRF header):
to the bare view without a key, and to the protected view with a new key per
request (first requests) or one key that is already stored (replays). The
servers run side by side, one per configuration; every round loads each
server's three scenarios in turn, so noise hits them alike, and every figure
is a median over rounds of a ratio to the same server's bare view.
Sends load to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

import common

#: Stored keys the replays cycle through (one key replayed by many connections at
#: once is not what clients do).
REPLAY_KEYS = 48


@dataclass
class Server:
    """One configuration under load: a gunicorn of its own."""

    label: str
    store: str
    path: str = common.PROTECTED_PATH
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    base: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    replay_keys: tuple[str, ...] = ()


#: The configurations the targets are about: sessions where the store is.
TARGET_SERVERS = (
    Server("database store (PostgreSQL)", "postgres"),
    Server(
        "database store (PostgreSQL), ATOMIC_REQUESTS",
        "postgres",
        env={"EXAMPLE_ATOMIC_REQUESTS": "1"},
    ),
    Server("Redis store, sessions in Redis", "redis", env={"BENCH_SESSIONS": "cache"}),
)


def measure(
    servers: list[Server], connections: list[int], seconds: float, rounds: int, workers: int
) -> dict[tuple[str, int], dict[str, list[float]]]:
    """Ratios to the bare view per (server, connections), one per round."""
    ratios: dict[tuple[str, int], dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        for offset, server in enumerate(servers):
            env = common.child_env(server.store, **server.env)
            common.prepare(env, server.python)
            server.base = stack.enter_context(
                common.gunicorn(env, common.PORT + offset, workers, server.python)
            )
            server.headers = common.session_headers(server.base)
            server.replay_keys = tuple(str(uuid.uuid4()) for _ in range(REPLAY_KEYS))
            for key in server.replay_keys:
                status, _ = common.post(server.base + server.path, key, server.headers)
                assert status == 201, (server.label, status)
        for round_ in range(rounds):
            for count in connections:
                for server in servers:
                    rps = {
                        name: load(server, name, count, seconds)
                        for name in ("bare", "first", "replay")
                    }
                    entry = ratios.setdefault((server.label, count), {})
                    for name in ("first", "replay"):
                        entry.setdefault(name, []).append(rps[name] / rps["bare"])
                    entry.setdefault("bare_rps", []).append(rps["bare"])
                    print(
                        f"  round {round_ + 1}, {count:2} connections, {server.label}: "
                        + ", ".join(f"{name} {value:.0f}/s" for name, value in rps.items()),
                        flush=True,
                    )
    return ratios


def load(server: Server, name: str, connections: int, seconds: float) -> float:
    path = common.BARE_PATH if name == "bare" else server.path
    result: dict[str, Any] = common.wrk(
        server.base + path, name, connections, seconds, server.headers, server.replay_keys
    )
    bad = {status: n for status, n in result["statuses"].items() if not status.startswith("2")}
    if bad or result["errors"]:
        print(f"  ! {server.label} {name}: {bad} errors {result['errors']}", flush=True)
    return float(result["rps"])


def report(ratios: dict[tuple[str, int], dict[str, list[float]]]) -> int:
    failed = 0
    for (label, count), entry in ratios.items():
        first, replay = common.median(entry["first"]), common.median(entry["replay"])
        bare = common.median(entry["bare_rps"])
        detail = f"bare {bare:.0f}/s, first x{first:.2f}, replay x{replay:.2f}"
        failed += not common.verdict(
            f"{count} connections, {label}: first >= x0.85, replay >= x1.5",
            first >= 0.85 and replay >= 1.5,
            detail,
        )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="8,32")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    args = parser.parse_args()
    if not common.wrk_available():
        print("SKIP  throughput: wrk is not installed (apt-get install wrk)")
        return 0
    common.reset_databases()
    connections = [int(count) for count in args.connections.split(",")]
    servers = [Server(s.label, s.store, env=dict(s.env)) for s in TARGET_SERVERS]
    report(measure(servers, connections, args.seconds, args.rounds, args.workers))
    return 0  # a FAIL is a finding, not a crash


if __name__ == "__main__":
    sys.exit(main())
