"""What the protection costs, side by side with the bare view, and how it scales.

    .venv/bin/python benchmarks/overhead.py            # everything, regenerates the docs outputs
    .venv/bin/python benchmarks/overhead.py --quick    # a smoke run (small counts, no 1M rows)

The example project's DRF booking-create view (``POST /api/bookings/``, under
``@idempotent``) is measured through the full middleware stack, next to the same
viewset class undecorated (``POST /bare/bookings/``, see ``bench_urls.py``):

1. in-process, with Django's test Client, for the database store on SQLite and on
   PostgreSQL (plus two explanatory PostgreSQL variants: ``ATOMIC_REQUESTS`` and
   ``synchronous_commit=off``) and for the Redis store: the bare view, the
   protected view without a key, the first request with a key, a replay, a reused
   key (409) and a key in progress (409); medians and p95 of interleaved requests;
   queries per request (``CaptureQueriesContext``); Redis commands per request
   (``INFO commandstats``); a cProfile of the hot path;
2. over HTTP: gunicorn (``--chdir example_project example.wsgi``) and wrk;
3. growth: 10k, 100k and 1M stored records on PostgreSQL, ``EXPLAIN (ANALYZE,
   BUFFERS)`` of the claim's statements, bytes per record in PostgreSQL and Redis.

Each part runs in its own process (Django is configured once per process), with
the example settings driven by environment variables (``_bench.child_env``).
It drops and recreates the PostgreSQL database ``bench_idempotency``, the SQLite
file ``/tmp/bench_idempotency.sqlite3`` and flushes Redis DB 14; load only goes to
127.0.0.1. Writes ``benchmarks/results.json``, ``docs/benchmarks-results.md`` and
``docs/images/benchmarks.png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _bench, http_load, report

IN_PROCESS_STORES = (
    "sqlite",
    "postgres",
    "postgres_atomic",
    "postgres_async",
    "postgres_memory",
    "redis",
)
HTTP_STORES = ("postgres", "redis")
PROFILED_STORES = ("postgres", "postgres_async", "redis")


def run_child(script: str, store: str, out: Path, *arguments: str) -> dict[str, Any]:
    command = [sys.executable, str(_bench.BENCH_DIR / script), "--out", str(out), *arguments]
    subprocess.run(command, env=_bench.child_env(store), check=True, timeout=1800)
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, growth to 100k")
    parser.add_argument("-n", type=int, default=400, help="requests per in-process scenario")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--profile-n", type=int, default=200)
    parser.add_argument("--http-seconds", type=int, default=2)
    parser.add_argument("--http-rounds", type=int, default=3)
    parser.add_argument("--http-workers", type=int, default=3)
    parser.add_argument("--growth-sizes", default="10000,100000,1000000")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-growth", action="store_true")
    parser.add_argument(
        "--report-only", action="store_true", help="re-render the docs from results.json"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.warmup, args.profile_n = 60, 10, 30
        args.http_seconds, args.http_rounds = 2, 1
        args.growth_sizes = "10000,100000"

    if args.report_only:
        report.render(_bench.load_results())
        return 0

    started = time.monotonic()
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "arguments": vars(args),
        "machine": report.machine(),
    }
    _bench.recreate_postgres()
    _bench.recreate_sqlite()
    _bench.flush_redis()

    with tempfile.TemporaryDirectory(prefix="bench-idempotency-") as tmp:
        results["inprocess"] = {}
        for store in IN_PROCESS_STORES:
            print(f"in-process: {_bench.STORE_LABELS[store]}", flush=True)
            profile_n = args.profile_n if store in PROFILED_STORES else 0
            results["inprocess"][store] = run_child(
                "inprocess.py",
                store,
                Path(tmp) / f"inprocess-{store}.json",
                "--store",
                store,
                "-n",
                str(args.n),
                "--warmup",
                str(args.warmup),
                "--profile-n",
                str(profile_n),
                "--slow-n",
                str(max(10, args.n // 5)),
            )
            report.print_inprocess(store, results["inprocess"][store])

        if not args.skip_http:
            if http_load.wrk_available():
                results["http"] = {}
                log = Path(tmp) / "gunicorn.log"
                for store in HTTP_STORES:
                    print(f"http: {_bench.STORE_LABELS[store]}", flush=True)
                    results["http"][store] = http_load.run_store(
                        store, args.http_seconds, args.http_rounds, args.http_workers, log
                    )
            else:
                print("http: skipped, wrk is not installed (apt-get install -y wrk)")

        if not args.skip_growth:
            print("growth: PostgreSQL", flush=True)
            results["growth"] = run_child(
                "growth.py",
                "postgres",
                Path(tmp) / "growth.json",
                "--sizes",
                args.growth_sizes,
                "-n",
                str(max(30, args.n // 3)),
            )

    results["runtime_seconds"] = time.monotonic() - started
    _bench.save_results(results)
    failures = report.render(results)
    print(f"\nruntime: {results['runtime_seconds']:.0f} s, {failures} target(s) failed")
    return 0  # a FAIL is a finding, not a crash


if __name__ == "__main__":
    sys.exit(main())
