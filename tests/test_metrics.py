"""The Prometheus recipe counts every decision the key contract makes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry

from idempotency_django.contrib import prometheus
from idempotency_django.stores import RecordKey, RequestInfo, StoreUnavailable
from idempotency_django.stores.base import Claim
from idempotency_django.stores.database import DatabaseStore

# isort: split
# The recipe as docs/metrics.md shows it (myproject/apps.py); exercised below.
from django.apps import AppConfig


class MyProjectConfig(AppConfig):
    name = "myproject"

    def ready(self) -> None:
        from idempotency_django.contrib import prometheus

        prometheus.connect()


METRIC = "idempotency_decisions_total"
RESERVED = {"decision": "reserved", "code": "", "reason": ""}
BODY = json.dumps({"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"})


class DownStore(DatabaseStore):
    """A store whose claim always fails, as an unreachable one would."""

    def claim(self, key: RecordKey, request: RequestInfo, lock_timeout: int) -> Claim:
        raise StoreUnavailable("the store is down")


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    prometheus.connect(registry)
    yield registry
    prometheus.disconnect()


def value(registry: CollectorRegistry, decision: str, code: str = "", reason: str = "") -> float:
    labels = {"decision": decision, "code": code, "reason": reason}
    return registry.get_sample_value(METRIC, labels) or 0.0


def post(client: Client, key: str, body: str = BODY, url: str = "/plain/bookings/") -> Any:
    return client.post(url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
def test_counts_every_decision(alice_client: Client, registry: CollectorRegistry) -> None:
    assert post(alice_client, "metrics-1").status_code == 201
    assert value(registry, "reserved") == 1
    assert value(registry, "stored") == 1

    replay = post(alice_client, "metrics-1")
    assert replay["Idempotency-Replayed"] == "true"
    assert value(registry, "replayed") == 1

    assert post(alice_client, "metrics-1", body="{}").status_code == 409
    assert value(registry, "conflict", code="idempotency_key_reused") == 1

    assert post(alice_client, "metrics-2", url="/plain/bookings/?status=500").status_code == 500
    assert value(registry, "released", reason="server_error") == 1
    assert post(alice_client, "metrics-3", url="/plain/bookings/?status=400").status_code == 400
    assert value(registry, "released", reason="not_retained") == 1

    with override_settings(IDEMPOTENCY={"STORE": f"{__name__}.DownStore"}):
        assert post(alice_client, "metrics-4").status_code == 503
    assert value(registry, "unavailable") == 1

    # Exact totals: every decision counted once, nothing else.
    assert value(registry, "reserved") == 3
    assert value(registry, "stored") == 1
    assert value(registry, "replayed") == 1
    assert value(registry, "conflict", code="idempotency_key_in_progress") == 0
    samples = {
        tuple(sorted(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == METRIC
    }
    assert sum(samples.values()) == 3 + 1 + 1 + 1 + 1 + 1 + 1


@pytest.mark.django_db
def test_unprotected_requests_are_not_counted(
    alice_client: Client, registry: CollectorRegistry
) -> None:
    alice_client.post("/plain/bookings/", BODY, content_type="application/json")  # no key
    alice_client.get("/api/bookings/")
    assert value(registry, "reserved") == 0


@pytest.mark.django_db
def test_connect_twice_counts_once(alice_client: Client, registry: CollectorRegistry) -> None:
    counter = prometheus.connect(registry)
    assert prometheus.connect(registry) is counter
    post(alice_client, "metrics-twice")
    assert value(registry, "reserved") == 1
    assert value(registry, "stored") == 1


@pytest.mark.django_db
def test_connect_to_another_registry_moves_the_counter(
    alice_client: Client, registry: CollectorRegistry
) -> None:
    other = CollectorRegistry()
    prometheus.connect(other)
    post(alice_client, "metrics-moved")
    assert value(other, "reserved") == 1
    assert registry.get_sample_value(METRIC, RESERVED) is None


@pytest.mark.django_db
def test_disconnect_stops_counting_and_unregisters(alice_client: Client) -> None:
    registry = CollectorRegistry()
    prometheus.connect(registry)
    prometheus.disconnect()
    prometheus.disconnect()  # safe when not connected
    post(alice_client, "metrics-off")
    assert list(registry.collect()) == []
    # Connecting again to the same registry works: the old counter was unregistered.
    prometheus.connect(registry)
    post(alice_client, "metrics-on")
    assert value(registry, "reserved") == 1
    prometheus.disconnect()


def test_default_registry() -> None:
    from prometheus_client import REGISTRY

    counter = prometheus.connect()
    try:
        counter.labels(decision="reserved", code="", reason="").inc(0)
        assert REGISTRY.get_sample_value(METRIC, RESERVED) == 0
    finally:
        prometheus.disconnect()
    assert REGISTRY.get_sample_value(METRIC, RESERVED) is None


@pytest.mark.django_db
def test_app_config_recipe_counts_on_the_default_registry(alice_client: Client) -> None:
    from prometheus_client import REGISTRY

    import tests.testapp

    MyProjectConfig("tests.testapp", tests.testapp).ready()
    try:
        post(alice_client, "metrics-default")
        assert REGISTRY.get_sample_value(METRIC, RESERVED) == 1
    finally:
        prometheus.disconnect()
