"""What does ``HEARTBEAT`` cost a request, and a store?

    python benchmarks/heartbeat.py                      # SQLite, PostgreSQL, Redis, memory
    python benchmarks/heartbeat.py --stores postgres -n 600 --running 200

A request: per pass, in a new order each time, a first request (a new key) with the
heartbeat off and with it on (``HEARTBEAT`` 5 s, ``LOCK_TIMEOUT`` 15 s), both shorter
than a beat: the cost on is registering the reservation with the heartbeat thread and
taking it back. Printed: each one's median and on/off, measured in the same process.

A store: ``--running`` reservations claimed and handed to the heartbeat, then rounds of
renewals as the heartbeat thread makes them (one ``renew`` per running request), timed
against the claims that made them. Printed: milliseconds per renewal, renewals per
round, and a renewal's cost as a ratio to a claim. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import random
import time
import uuid
from typing import Any

import common

SCENARIOS = ("off", "on")


def child(args: argparse.Namespace) -> dict[str, Any]:
    common.setup_django()
    from django.conf import settings
    from django.test import Client, override_settings

    from idempotency_django.protocol.heartbeat import heartbeat
    from idempotency_django.stores import RecordKey, RequestInfo, get_store

    client = Client(HTTP_AUTHORIZATION=common.AUTHORIZATION)
    run, counter = uuid.uuid4().hex[:8], iter(range(10**9))
    # Both under a settings override of their own, so that what overriding costs
    # (Django's setting_changed) is in both and out of the ratio.
    overrides = {
        name: override_settings(
            IDEMPOTENCY={**settings.IDEMPOTENCY, "HEARTBEAT": beat, "LOCK_TIMEOUT": 15}
        )
        for name, beat in (("off", None), ("on", 5))
    }

    def first(scenario: str) -> None:
        with overrides[scenario]:
            key = f"hb-{run}-{next(counter)}"
            status = common.client_post(client, common.PROTECTED_PATH, key)
        assert status == 201, status

    calls = {name: functools.partial(first, name) for name in SCENARIOS}
    samples: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    order, shuffle = list(calls), random.Random(0).shuffle
    for index in range(args.warmup + args.n):
        shuffle(order)
        for name in order:
            started = time.perf_counter_ns()
            calls[name]()
            elapsed = time.perf_counter_ns() - started
            if index >= args.warmup:
                samples[name].append(elapsed / 1e6)
    result: dict[str, Any] = {name: common.median(values) for name, values in samples.items()}

    # The store's side: what the heartbeat thread does each round.
    store = get_store()
    info = RequestInfo(fingerprint="f" * 64, method="POST", path="/bench/", request_id="")
    keys = [RecordKey("bench:heartbeat", "", f"run-{run}-{n}") for n in range(args.running)]
    started = time.perf_counter_ns()
    tokens = [store.claim(key, info, 15).token for key in keys]
    claim_ms = (time.perf_counter_ns() - started) / 1e6 / len(keys)
    pairs = zip(keys, tokens, strict=True)
    beats = [heartbeat.start(store, key, token, info, 15) for key, token in pairs]
    rounds = []
    for _ in range(args.rounds):
        started = time.perf_counter_ns()
        renewed = sum(beat.renew() for beat in beats)
        rounds.append((time.perf_counter_ns() - started) / 1e6 / len(beats))
        assert renewed == len(beats), renewed
    for beat, key, token in zip(beats, keys, tokens, strict=True):
        beat.stop()
        store.release(key, token)
    result.update(claim=claim_ms, renewal=common.median(rounds))
    return result


def measure(args: argparse.Namespace) -> None:
    common.reset_databases()
    rows = []
    for store in args.stores.split(","):
        medians = common.run_child(
            "heartbeat.py",
            store,
            *("-n", str(args.n), "--warmup", str(args.warmup)),
            *("--running", str(args.running), "--rounds", str(args.rounds)),
        )
        off, on = medians["off"], medians["on"]
        rows.append(
            [
                common.STORE_LABELS[store],
                f"{off:.3f}",
                f"{on:.3f} (x{on / off:.2f})",
                f"{medians['renewal']:.3f}",
                f"x{medians['renewal'] / medians['claim']:.2f}",
            ]
        )
    common.table(
        [
            "Store",
            "first request, off (ms)",
            "on (ms, x off)",
            f"a renewal (ms, {args.running} running)",
            "a renewal / a claim",
        ],
        rows,
    )


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--stores", default="sqlite,postgres,redis,memory")
    parser.add_argument("-n", type=int, default=300, help="measured passes")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--running", type=int, default=100, help="reservations renewed")
    parser.add_argument("--rounds", type=int, default=5, help="renewal rounds")
    common.run(parser, measure, child)


if __name__ == "__main__":
    main()
