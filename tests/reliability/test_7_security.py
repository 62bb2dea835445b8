"""Scenario 7: scopes never share stored responses; nothing secret is logged or stored.

The last tests scan everything the suite's servers wrote (their stdout and
stderr) and a dump of every table of every database (and every Redis entry)
for passwords, Authorization values, session cookies, webhook tokens and the
body marker every booking request carries in a field DRF ignores.
"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.reliability import harness
from tests.reliability.harness import STORE_LABELS, Row

LOCATIONS = ("L1", "L2", None)
PRINCIPALS = ("alice", "bob", None)

#: Django's ``django.request`` logger line for a 4xx/5xx: "Bad Request: /hooks/<token>/".
DJANGO_REQUEST_LOG = re.compile(r"^[A-Z][A-Za-z ]+: /hooks/\S*$")


def attempt(
    stack: harness.Stack, who: str | None, location: str | None, key: str, body: bytes
) -> harness.Reply:
    user = stack.users[who] if who else None
    headers = harness.json_headers(user, key, location, mode="basic")
    return harness.send(stack.port, "POST", "/api/bookings/", headers, body)


@pytest.mark.parametrize("store", ["db-postgres", "redis"])
def test_no_scope_obtains_another_scopes_response(store: str) -> None:
    with harness.stack(f"security-{store}", store) as stack:
        key = f"shared-{uuid.uuid4().hex[:10]}"
        body = harness.booking_body(f"sec-{uuid.uuid4().hex[:8]}")
        original = attempt(stack, "alice", "L1", key, body)
        assert original.status == 201 and not original.replayed, original.short()
        first: dict[tuple[str | None, str | None], harness.Reply] = {}
        second: dict[tuple[str | None, str | None], harness.Reply] = {}
        for round_ in (first, second):
            for who in PRINCIPALS:
                for location in LOCATIONS:
                    round_[who, location] = attempt(stack, who, location, key, body)
        # The same principal through the session: its own scope, so a replay.
        alice_session = harness.send(
            stack.port,
            "POST",
            "/api/bookings/",
            harness.json_headers(stack.users["alice"], key, "L1", mode="session"),
            body,
        )
        bob_list = harness.send(
            stack.port,
            "GET",
            "/api/bookings/",
            [*stack.users["bob"].auth_headers("session"), ("X-Location-Id", "L1")],
        )
        # Webhook deliveries: the token is in the URL only.
        token = f"trg_{uuid.uuid4().hex}"
        harness.SECRETS[token] = "webhook token"
        hook = f"/hooks/{token}/"
        event = b'{"type": "booking.paid", "booking": 1}'
        delivery = [("Content-Type", "application/json"), ("webhook-id", "msg_1")]
        hooks = [harness.send(stack.port, "POST", hook, delivery, event) for _ in range(2)]
        hooks.append(harness.send(stack.port, "POST", hook, delivery[:1], b"not json"))
        bookings = stack.db.bookings_by_customer()

    leaks = []
    for round_ in (first, second):
        for (who, location), reply in round_.items():
            if (who, location) == ("alice", "L1"):
                continue
            if reply.body == original.body or (
                reply.status == 201 and reply.json().get("id") == original.json()["id"]
            ):
                leaks.append(f"{who}/{location}: {reply.short()}")
    customer = original.json()["customer"]
    others = [
        (who, loc) for who in ("alice", "bob") for loc in LOCATIONS if (who, loc) != ("alice", "L1")
    ]
    everything = [original, *first.values(), *second.values(), alice_session, bob_list, *hooks]
    harness.record(
        Row(
            "7 scopes: user A/B/anonymous x L1/L2/none",
            STORE_LABELS[store],
            len(everything),
            1 + len(others),
            len(bookings.get(customer, [])),
            harness.five_xx(everything),
            0,
            0,
            note=f"{len(leaks)} responses leaked across scopes",
        )
    )
    assert not leaks, leaks
    for round_, replayed in ((first, False), (second, True)):
        assert round_["alice", "L1"].replayed and round_["alice", "L1"].body == original.body
        for scope in others:
            reply = round_[scope]
            assert reply.status == 201 and reply.replayed is replayed, (scope, reply.short())
            assert reply.body == first[scope].body
        for location in LOCATIONS:
            anonymous = round_[None, location]
            assert anonymous.status in (401, 403) and not anonymous.replayed, anonymous.short()
    assert alice_session.replayed and alice_session.body == original.body
    assert original.json()["id"] not in [item["id"] for item in bob_list.json()]
    assert len(bookings[customer]) == 1 + len(others)
    assert [reply.status for reply in hooks] == [202, 202, 400]
    assert hooks[0].json()["status"] == "accepted" and hooks[1].json()["status"] == "duplicate"


#: The restarted cluster's own log (not the server's output): see test_no_secret_in_postgres_log.
POSTGRES_LOG = "own PostgreSQL cluster"


def findings(ignore_django_request_log: bool, postgres_log: bool = False) -> dict[str, list[str]]:
    """Which secret (by description) appears in which artifact."""
    found: dict[str, list[str]] = {}
    for label, path in harness.ARTIFACTS:
        if label.startswith(POSTGRES_LOG) is not postgres_log:
            continue
        text = path.read_text(errors="replace")
        if ignore_django_request_log:
            text = "\n".join(
                line for line in text.splitlines() if not DJANGO_REQUEST_LOG.match(line)
            )
        for secret, what in harness.SECRETS.items():
            if secret in text:
                found.setdefault(what, []).append(label)
    return found


def test_no_secret_in_any_output_or_table() -> None:
    """Every artifact of every stack this session ran (this test runs last)."""
    assert harness.ARTIFACTS, "no stack ran before this test"
    found = findings(ignore_django_request_log=True)
    harness.record(
        Row(
            "7 secrets in server output and table dumps",
            f"every stack: {len(harness.ARTIFACTS)} logs and dumps",
            len(harness.SECRETS),
            0,
            len(found),
            0,
            0,
            0,
            note=f"{len(harness.SECRETS)} secret values searched; found: "
            + (", ".join(f"{what} in {where[0]}" for what, where in found.items()) or "none"),
        )
    )
    assert not found, found


def test_no_webhook_token_in_django_request_log() -> None:
    tokens = {what for what in harness.SECRETS.values() if what == "webhook token"}
    assert tokens, "no webhook was sent"
    found = findings(ignore_django_request_log=False)
    assert "webhook token" not in found, found["webhook token"][:5]


POSTGRES_STATEMENT_LOGGED = (
    "PostgreSQL, not the library: when a query fails (here, killed by the restart's fast "
    "shutdown) the server log's STATEMENT line holds the SQL with its literals, e.g. the "
    "django_session lookup with the session key, i.e. the session cookie (Django's psycopg "
    "backend binds parameters client-side). Only when a session query is in flight at the "
    "stop, so not strict"
)


@pytest.mark.xfail(strict=False, reason=POSTGRES_STATEMENT_LOGGED)
def test_no_secret_in_postgres_log() -> None:
    logs = [label for label, _ in harness.ARTIFACTS if label.startswith(POSTGRES_LOG)]
    if not logs:
        pytest.skip("the PostgreSQL restart scenario did not run")
    found = findings(ignore_django_request_log=False, postgres_log=True)
    harness.record(
        Row(
            "7 secrets in the restarted cluster's PostgreSQL log",
            "own cluster",
            len(harness.SECRETS),
            0,
            len(found),
            0,
            0,
            0,
            note="found: " + (", ".join(found) or "none"),
        )
    )
    assert not found, found
