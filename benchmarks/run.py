"""Every benchmark in turn, each in processes of its own; ``--quick`` is the smoke run.

    python benchmarks/run.py --quick        # under 2 minutes: small counts, one round
    python benchmarks/run.py                # the figures of docs/benchmarks-results.md
    python benchmarks/run.py --peers        # ... and the peers side by side (PyPI venvs)

A FAIL line is a finding, not a crash: the exit status is non-zero only when a
benchmark could not run (or, with ``--strict``, when a target failed).
"""

from __future__ import annotations

import subprocess
import sys
import time

import common

QUICK = {
    "inprocess.py": ["-n", "60", "--warmup", "10", "--rounds", "1"],
    "throughput.py": ["--connections", "8", "--seconds", "1", "--rounds", "1", "--workers", "2"],
    "waiter.py": ["--hold", "0.5", "--waiters", "2"],
    "tasks.py": ["-n", "100", "--warmup", "10"],
    "heartbeat.py": ["-n", "60", "--warmup", "10", "--running", "20", "--rounds", "2"],
    "claim_sql.py": ["-n", "30", "--warmup", "5"],
    "size.py": [],
}
FULL = {
    "inprocess.py": ["--profile"],
    "instructions.py": [],
    "throughput.py": [],
    "waiter.py": [],
    "tasks.py": [],
    "heartbeat.py": [],
    "claim_sql.py": [],
    "size.py": [],
}


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peers", action="store_true", help="also run peers.py")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    plan = {**(QUICK if args.quick else FULL), **({"peers.py": []} if args.peers else {})}
    started, failed = time.monotonic(), 0
    for script, arguments in plan.items():
        print(f"\n== {script} {' '.join(arguments)}", flush=True)
        command = [sys.executable, str(common.BENCH_DIR / script), *arguments]
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
            for line in process.stdout or ():
                print(line, end="", flush=True)
                failed += line.startswith("FAIL")
        if process.returncode:
            raise SystemExit(f"{script} could not run (exit status {process.returncode})")
    print(f"\n{failed} target(s) failed; {time.monotonic() - started:.0f} s")
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
