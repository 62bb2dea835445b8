"""How does it compare with the other Django packages, over HTTP?

    python benchmarks/peers.py --venvs /work/venvs      # one venv per peer, made if missing

Each peer is installed from PyPI into a virtualenv of its own (``<venvs>/<name>``,
with this project's dev dependencies) and protects the same booking viewset as
its README says (``bench_settings.py``, ``bench_urls.py``). Every server is
session-authenticated and measured side by side with the others, with
``CONN_MAX_AGE`` 600 and 0, at one connection and under load: first requests
and replays as ratios to the same server's bare view, and the replay's
requests per second against the fastest peer's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import common
import throughput
from throughput import Server

#: name: (stores it is measured on, whether it scopes keys per user)
PEERS = {
    "drf-idempotency": (("postgres", "redis"), False),
    "django-idempotency-key": (("redis",), False),  # a Django cache is its only shared store
    "drf-idempotencykey": (("postgres",), True),
}
OURS = "idempotency-django"


def peer_python(venvs: Path, name: str) -> str:
    """The peer's virtualenv (made with ``pip`` on first use): its Python."""
    venv = venvs / name
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = [str(python), "-m", "pip", "install", "-q", "-e", f"{common.ROOT}[dev]", name]
        subprocess.run(install, check=True)
    return str(python)


def servers(venvs: Path, conn_max_ages: list[int]) -> list[Server]:
    made = []
    for age in conn_max_ages:
        for store in ("postgres", "redis"):
            env = {"BENCH_CONN_MAX_AGE": str(age)}
            if store == "redis":
                env["BENCH_SESSIONS"] = "cache"
            made.append(Server(f"{OURS} {store} age={age}", store, env=dict(env)))
            for name, (stores, _) in PEERS.items():
                if store in stores:
                    peer_env = {**env, "BENCH_PEER": name}
                    python = peer_python(venvs, name)
                    label = f"{name} {store} age={age}"
                    made.append(Server(label, store, common.PEER_PATH, python, peer_env))
    return made


def versions(venvs: Path) -> dict[str, str]:
    found = {}
    for name in PEERS:
        show = [peer_python(venvs, name), "-m", "pip", "show", name]
        output = subprocess.run(show, capture_output=True, text=True, check=True).stdout
        lines = output.splitlines()
        found[name] = next(line.split()[1] for line in lines if line.startswith("Version:"))
    return found


def report(ratios: dict[tuple[str, int], dict[str, list[float]]], found: dict[str, str]) -> int:
    print("\n| Package | Store | CONN_MAX_AGE | Connections | Per user | First | Replay |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    replay_rps: dict[tuple[str, int], float] = {}
    for (label, count), entry in ratios.items():
        name, store, age = label.split()
        replay_rps[(label, count)] = common.median(entry["replay"]) * common.median(
            entry["bare_rps"]
        )
        package = f"{name} {found.get(name, '(this)')}"
        per_user = "yes" if name == OURS or PEERS[name][1] else "no"
        print(
            f"| {package} | {store} | {age.split('=')[1]} | {count} | {per_user} "
            f"| x{common.median(entry['first']):.2f} | x{common.median(entry['replay']):.2f} |"
        )
    failed = 0
    for (label, count), entry in ratios.items():
        name, store, age = label.split()
        if name == OURS:
            continue
        ours = ratios[(f"{OURS} {store} {age}", count)]
        if PEERS[name][1]:
            first, replay = common.median(ours["first"]), common.median(ours["replay"])
            theirs = common.median(entry["first"]), common.median(entry["replay"])
            failed += not common.verdict(
                f"ahead of {name} ({store}, {age}, {count} conn.), first and replay",
                first >= theirs[0] and replay >= theirs[1],
                f"first x{first:.2f} vs x{theirs[0]:.2f}, replay x{replay:.2f} vs x{theirs[1]:.2f}",
            )
    for age_count in {(label.split()[2], count) for label, count in ratios}:
        age, count = age_count
        peers = [
            (rps, label)
            for (label, n), rps in replay_rps.items()
            if n == count and label.endswith(age) and not label.startswith(OURS)
        ]
        fastest, who = max(peers)
        ours_rps = replay_rps[(f"{OURS} redis {age}", count)]
        failed += not common.verdict(
            f"Redis store replay within x1.5 of the fastest peer's ({age}, {count} conn.)",
            fastest / ours_rps <= 1.5,
            f"{ours_rps:.0f}/s vs {fastest:.0f}/s ({who}): x{fastest / ours_rps:.2f}",
        )
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venvs", default="/tmp/bench-peer-venvs", type=Path)
    parser.add_argument("--connections", default="1,32")
    parser.add_argument("--conn-max-age", default="600,0")
    parser.add_argument("--seconds", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not common.wrk_available():
        print("SKIP  peers: wrk is not installed (apt-get install wrk)")
        return 0
    common.reset_databases()
    ages = [int(age) for age in args.conn_max_age.split(",")]
    measured = servers(args.venvs, ages)
    connections = [int(count) for count in args.connections.split(",")]
    ratios = throughput.measure(measured, connections, args.seconds, args.rounds, args.workers)
    report(ratios, versions(args.venvs))
    return 0  # a FAIL is a finding, not a crash


if __name__ == "__main__":
    sys.exit(main())
