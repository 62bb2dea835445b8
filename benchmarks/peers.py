"""How does it compare with the other Django packages, over HTTP?

    python benchmarks/peers.py --venvs /work/venvs      # one venv per peer, made if missing

Each peer from PyPI in a virtualenv of its own (``<venvs>/<name>``) protects the same
viewset as its README says; all servers side by side, as in throughput.py, with
CONN_MAX_AGE 600 and 0. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import common
import throughput

#: name: (stores it is measured on, whether it scopes keys per user)
PEERS = {
    "drf-idempotency": (("postgres", "redis"), False),
    "django-idempotency-key": (("redis",), False),  # a Django cache is its only shared store
    "drf-idempotencykey": (("postgres",), True),
}
OURS = "idempotency-django"


def peer_python(venvs: Path, name: str) -> str:
    """The peer's virtualenv (made with ``pip`` on first use): its Python."""
    python = venvs / name / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venvs / name)], check=True)
        install = [str(python), "-m", "pip", "install", "-q", "-e", f"{common.ROOT}[dev]", name]
        subprocess.run(install, check=True)
    return str(python)


def version(venvs: Path, name: str) -> str:
    show = [peer_python(venvs, name), "-m", "pip", "show", name]
    lines = subprocess.run(show, capture_output=True, text=True, check=True).stdout.splitlines()
    return next(line.split()[1] for line in lines if line.startswith("Version:"))


def servers(venvs: Path, ages: list[int]) -> list[throughput.Server]:
    made = []
    for age in ages:
        for store in ("postgres", "redis"):
            env = {"BENCH_CONN_MAX_AGE": str(age)}
            if store == "redis":
                env["BENCH_SESSIONS"] = "cache"
            made.append(throughput.Server(f"{OURS} {store} age={age}", store, dict(env)))
            for name, (stores, _) in PEERS.items():
                if store in stores:
                    peer_env, python = {**env, "BENCH_PEER": name}, peer_python(venvs, name)
                    label = f"{name} {store} age={age}"
                    made.append(throughput.Server(label, store, peer_env, common.PEER_PATH, python))
    return made


def report(runs: throughput.Runs, versions: dict[str, str]) -> None:
    rows, replay_rps = [], {}
    for (label, count), measured in runs.items():
        name, store, age = label.split()
        first, replay = common.ratio(measured, "first"), common.ratio(measured, "replay")
        replay_rps[(label, count)] = replay * common.median([run["bare"] for run in measured])
        per_user = "yes" if name == OURS or PEERS[name][1] else "no"
        package = f"{name} {versions.get(name, '(this)')}"
        figures = [f"x{first:.2f}", f"x{replay:.2f}"]
        rows.append([package, store, age.split("=")[1], count, per_user, *figures])
    print()
    header = ["Package", "Store", "CONN_MAX_AGE", "Connections", "Per user", "First", "Replay"]
    common.table(header, rows)
    for (label, count), measured in runs.items():
        name, store, age = label.split()
        if name != OURS and PEERS[name][1]:
            ours = runs[(f"{OURS} {store} {age}", count)]
            first, replay = common.ratio(ours, "first"), common.ratio(ours, "replay")
            theirs = common.ratio(measured, "first"), common.ratio(measured, "replay")
            common.verdict(
                f"ahead of {name} ({store}, {age}, {count} conn.), first and replay",
                first >= theirs[0] and replay >= theirs[1],
                f"first x{first:.2f} vs x{theirs[0]:.2f}, replay x{replay:.2f} vs x{theirs[1]:.2f}",
            )
    for age, count in {(label.split()[2], count) for label, count in runs}:
        fastest, who = max(
            (rps, label)
            for (label, n), rps in replay_rps.items()
            if n == count and label.endswith(age) and not label.startswith(OURS)
        )
        ours_rps = replay_rps[(f"{OURS} redis {age}", count)]
        common.verdict(
            f"Redis store replay within x1.5 of the fastest peer's ({age}, {count} conn.)",
            fastest / ours_rps <= 1.5,
            f"{ours_rps:.0f}/s vs {fastest:.0f}/s ({who}): x{fastest / ours_rps:.2f}",
        )


def measure(args: argparse.Namespace) -> None:
    if throughput.have_wrk("peers"):
        common.reset_databases()
        runs = throughput.measure(servers(args.venvs, args.conn_max_age), args)
        report(runs, {name: version(args.venvs, name) for name in PEERS})


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--venvs", default="/tmp/bench-peer-venvs", type=Path)
    parser.add_argument("--connections", type=common.integers, default="1,32")
    parser.add_argument("--conn-max-age", type=common.integers, default="600,0")
    parser.add_argument("--seconds", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    common.run(parser, measure)
