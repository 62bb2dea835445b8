"""How many instructions does a keyed request execute beside the bare view (callgrind)?

    python benchmarks/instructions.py                         # the in-memory store
    python benchmarks/instructions.py --before /tmp/old       # another checkout, same run
    python benchmarks/instructions.py --stores memory,memory_quiet,postgres -n 50

On a shared machine a request's time moves by 10 to 30 % from one process to the next;
the instructions it executes (valgrind's callgrind counts them) move by about 0.1 %
(5 k of 5.2 M; a first request's difference from the bare view by about 15 k, from
where the heap's objects land). So a change of a few microseconds to the library's
own Python shows here when ``inprocess.py`` cannot tell it from noise. Per code and
store, one process per scenario sets Django up, warms up and sends -n requests of it
(a new key each, or the same stored key); one process sends none, and is subtracted.
Not seen here: waits (a database's commits, the network), and what caches and memory
cost: ``inprocess.py`` and ``throughput.py`` measure those. Needs valgrind; each
process takes about a minute. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import common

#: What a measured process sends -n of; "none" sends nothing, the setup to subtract;
#: "floor" sends a first request's two statements by psycopg alone, "django_floor"
#: the same through Django's cursor (PostgreSQL only).
FLOORS = ("floor", "django_floor")
RUNS = ("none", *common.SCENARIOS, *FLOORS)
#: The stores whose floor is measured, as inprocess.py measures its back-to-back floor.
FLOOR_STORES = ("postgres",)
#: Issue 36's target for the library's own work: a first request at most this of the bare view.
OWN_LIMIT = 1.10
#: callgrind's total on stderr: "==123== I   refs:      5,231,357,843".
TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """A measured process: the setup, the warm-up of every scenario, then -n of one."""
    # No collection during the setup: when one falls there depends on how often
    # psycopg waited for the server, and a full one costs tens of millions of
    # instructions, more than -n requests differ by. It runs again for the requests.
    gc.disable()
    common.setup_django()
    requests = common.scenario_requests()
    if args.floors:
        from inprocess import statement_floor

        for name in FLOORS:  # every process sends them in its warm-up: the same setup
            floor = statement_floor(through_django=name == "django_floor")
            requests[name] = lambda index, floor=floor: floor() and 201
    for index in range(args.warmup):
        for send in requests.values():
            assert send(-1 - index) == 201
    # The heap so far is the setup's: a full collection of it costs tens of millions
    # of instructions, and whether one falls in the -n requests depends on how much
    # the code allocated before them. Frozen, a collection sees the requests' objects.
    gc.collect()
    gc.freeze()
    gc.enable()
    for index in range(args.n if args.scenario != "none" else 0):
        assert requests[args.scenario](index) == 201
    return {}


def count(
    store: str, scenario: str, n: int, warmup: int, code: Path, python: str, floors: bool
) -> int:
    """The instructions of one measured process, as callgrind counts them."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        python or sys.executable,
        str(common.BENCH_DIR / "instructions.py"),
        "--child",
        "--scenario",
        scenario,
        "-n",
        str(n),
        "--warmup",
        str(warmup),
        *(["--floors"] if floors else []),
    ]
    env = common.child_env(store, code)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    found = TOTAL.search(done.stderr)
    if done.returncode or found is None:
        raise SystemExit(f"instructions.py {store} {scenario} failed:\n{done.stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def measure(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        print("skipped: needs valgrind (Debian's valgrind package)")
        return
    common.reset_databases()
    codes = {"after": (common.ROOT, "")}
    if args.before:
        codes = {"before": (Path(args.before), args.before_python), **codes}
    for store in args.stores.split(","):
        for code, python in codes.values():
            # Migrated once, before the measured processes run side by side: two
            # migrating one PostgreSQL database at once would race.
            common.run_child(
                "instructions.py", store, "-n", "0", "--warmup", "0", code=code, python=python
            )

    def floors(label: str, store: str) -> bool:
        return store in FLOOR_STORES and label == "after"

    jobs = [
        (label, store, scenario)
        for store in args.stores.split(",")
        for label in codes
        for scenario in RUNS
        if scenario not in FLOORS or floors(label, store)
    ]
    # One process per core: callgrind runs each on one thread, and counts do not
    # depend on what else runs.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        totals = dict(
            zip(
                jobs,
                pool.map(
                    lambda job: count(
                        job[1], job[2], args.n, args.warmup, *codes[job[0]], floors(*job[:2])
                    ),
                    jobs,
                ),
                strict=True,
            )
        )
    rows, own = [], {}
    for label in codes:
        for store in args.stores.split(","):
            setup = totals[(label, store, "none")]
            per = {
                name: (totals[(label, store, name)] - setup) / args.n for name in common.SCENARIOS
            }
            own[(label, store)] = per["first"] / per["bare"]
            rows.append(
                [
                    label,
                    common.STORE_LABELS[store],
                    f"{per['bare'] / 1e6:.3f} M",
                    f"{(per['first'] - per['bare']) / 1e3:+.0f} k",
                    f"x{per['first'] / per['bare']:.3f}",
                    f"x{per['replay'] / per['bare']:.3f}",
                ]
            )
    print("\ninstructions per request (callgrind), ratios to the bare view in the same code")
    headers = ["Code", "Store", "Bare view", "First minus bare", "First request", "Replay"]
    common.table(headers, rows)
    for store in args.stores.split(","):
        if ("after", store, "floor") in totals:
            # inprocess.py's floor target, its Python alone: the first request less
            # its two statements sent by psycopg, against the bare view.
            per = {
                name: (totals[("after", store, name)] - totals[("after", store, "none")]) / args.n
                for name in ("bare", "first", *FLOORS)
            }
            ratio = (per["first"] - per["floor"]) / per["bare"]
            common.verdict(
                f"first request at most the floor + 10 %, in instructions, {store}",
                ratio <= OWN_LIMIT,
                f"x{ratio:.3f}: its two statements by psycopg {per['floor'] / 1e3:.0f} k, "
                f"through Django's cursor {per['django_floor'] / 1e3:.0f} k; the library's "
                f"own rest {(per['first'] - per['django_floor'] - per['bare']) / 1e3:+.0f} k",
            )
        if store.startswith("memory"):
            ratio = own[("after", store)]
            common.verdict(
                f"the library's own work at most x{OWN_LIMIT:.2f} of the bare view, {store}",
                ratio <= OWN_LIMIT,
                f"first request x{ratio:.3f} in instructions ({common.STORE_LABELS[store]})",
            )


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--scenario", choices=RUNS, default="none", help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=200, help="requests per measured process")
    parser.add_argument("--warmup", type=int, default=20, help="of each scenario, first")
    parser.add_argument("--floors", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="memory")
    parser.add_argument("--before", help="another checkout of the library to compare with")
    parser.add_argument("--before-python", default="", help="the Python that runs --before")
    common.run(parser, measure, child)
