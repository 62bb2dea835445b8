"""Over HTTP: gunicorn serving the example project, wrk generating the load (127.0.0.1 only).

Scenarios per store, each ``--http-rounds`` times ``--http-seconds`` seconds,
interleaved: the bare view at 1, 8 and 32 connections; first requests (a new key
each) and replays (one key) at 8; a retry storm at 1, 8 and 32 connections, where
each key is sent ``STORM_GROUP`` times in a row (so with 8 or more connections the
duplicates race each other: one runs, the others get ``409 in progress`` or the
replay)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _bench

LUA = _bench.BENCH_DIR / "wrk_post.lua"
STORM_GROUP = 8
PORT = 8765


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def start_gunicorn(store: str, workers: int, log: Path) -> subprocess.Popen[bytes]:
    gunicorn = Path(sys.executable).with_name("gunicorn")
    command = [
        str(gunicorn),
        "--chdir",
        str(_bench.ROOT / "example_project"),
        "example.wsgi",
        "--workers",
        str(workers),
        "--bind",
        f"127.0.0.1:{PORT}",
        "--backlog",
        "256",
        "--log-level",
        "warning",
    ]
    with log.open("ab") as stream:
        process = subprocess.Popen(
            command, env=_bench.child_env(store), stdout=stream, stderr=stream
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"gunicorn exited with {process.returncode}; see {log}")
        try:
            post(_bench.BARE_PATH, f"ready-{uuid.uuid4().hex}")
            return process
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    stop_gunicorn(process)
    raise SystemExit(f"gunicorn did not answer; see {log}")


def stop_gunicorn(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def post(path: str, key: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=_bench.BODY.encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": _bench.AUTHORIZATION,
            "X-Location-Id": _bench.LOCATION,
            "Idempotency-Key": key,
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def run_wrk(mode: str, path: str, connections: int, duration: int, prefix: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(
        {
            "BENCH_PATH": path,
            "BENCH_MODE": mode,
            "BENCH_AUTH": _bench.AUTHORIZATION,
            "BENCH_PREFIX": prefix,
            "BENCH_GROUP": str(STORM_GROUP),
        }
    )
    command = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{duration}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{PORT}",
    ]
    output = subprocess.run(
        command, env=env, capture_output=True, text=True, check=True, timeout=duration + 60
    ).stdout
    line = next(line for line in output.splitlines() if line.startswith("BENCH_JSON "))
    data: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    data["rps"] = data["requests"] / (data["duration_us"] / 1e6)
    data["connections"] = connections
    return data


def run_store(store: str, duration: int, rounds: int, workers: int, log: Path) -> dict[str, Any]:
    """Every scenario ``rounds`` times, interleaved, so the machine's noise hits all alike."""
    process = start_gunicorn(store, workers, log)
    run = uuid.uuid4().hex[:8]
    segments: dict[str, list[dict[str, Any]]] = {}
    try:
        replay_prefix = f"http-replay-{run}"
        assert post(_bench.PROTECTED_PATH, f"{replay_prefix}-replay") == 201
        plan = [
            ("bare@8", "bare", _bench.BARE_PATH, 8),
            ("first@8", "first", _bench.PROTECTED_PATH, 8),
            ("replay@8", "replay", _bench.PROTECTED_PATH, 8),
            ("bare@1", "bare", _bench.BARE_PATH, 1),
            ("storm@1", "storm", _bench.PROTECTED_PATH, 1),
            ("storm@8", "storm", _bench.PROTECTED_PATH, 8),
            ("bare@32", "bare", _bench.BARE_PATH, 32),
            ("storm@32", "storm", _bench.PROTECTED_PATH, 32),
        ]
        for round_index in range(rounds):
            for label, mode, path, connections in plan:
                prefix = replay_prefix if mode == "replay" else f"http-{label}-{run}-{round_index}"
                segments.setdefault(label, []).append(
                    run_wrk(mode, path, connections, duration, prefix)
                )
    finally:
        stop_gunicorn(process)
    results = {label: _merge(parts) for label, parts in segments.items()}
    for label, stats in results.items():
        print(
            f"  http {store:<8} {label:<9} {stats['rps']:7.0f} req/s  "
            f"p50 {stats['p50_ms']:6.1f} ms  p95 {stats['p95_ms']:6.1f} ms  {stats['statuses']}",
            flush=True,
        )
    return results


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for part in parts:
        for status, count in part["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    requests = sum(part["requests"] for part in parts)
    seconds = sum(part["duration_us"] for part in parts) / 1e6
    return {
        "connections": parts[0]["connections"],
        "requests": requests,
        "rps": requests / seconds,
        "p50_ms": statistics.median(part["p50_us"] for part in parts) / 1000,
        "p95_ms": statistics.median(part["p95_us"] for part in parts) / 1000,
        "errors": sum(part["errors"] for part in parts),
        "statuses": dict(sorted(statuses.items())),
    }
