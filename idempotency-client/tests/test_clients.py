"""The three clients over real HTTP (tests/http_recorder.py, a server on 127.0.0.1):
the same key and bytes on every attempt, the caps, redirects, logs, and refused calls.

The clients against idempotency-django itself (a lost answer replayed, in progress
waited out, one booking) are tests/test_client.py of the repository: they need its
example project.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hashlib
import json
import logging
import re
import subprocess
import sys
import traceback
from typing import Any

import httpx
import pytest
import requests
from http_recorder import Answer, Recorder, free_port
from three_clients import Api

from idempotency_client import (
    AsyncIdempotentClient,
    IdempotentClient,
    IdempotentRequestError,
    RequestRejected,
    RetriesExhausted,
    RetryPolicy,
)

BODY = {"amount": 4200, "iban": "DE89370400440532013000"}
SECRETS = {"X-Api-Key": "sk_live_secret", "Authorization": "Bearer tok_secret"}
NO_WAIT = RetryPolicy(attempts=3, base=0.0, cap=0.0)


def test_the_client_imports_no_django() -> None:
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, idempotency_client; print(sorted(m for m in sys.modules"
            " if m.split('.')[0] in {'django', 'idempotency_django', 'requests', 'httpx'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "[]"


def test_a_retry_sends_the_same_method_path_key_and_bytes(kind: str) -> None:
    gateway = [Answer(502), Answer(429, {"Retry-After": "0"}), Answer(503)]
    with Recorder({"/pay/": gateway}) as api:
        client = Api(kind, policy=RetryPolicy(attempts=4), jitter=lambda: 0.0)
        response = client.request("PUT", f"{api.base}/pay/", json=BODY, location="berlin")
    assert response.status_code == 201
    assert client.sleeps == [0.0, 0.0, 0.0]
    first, *retries = api.seen
    assert len(retries) == 3
    assert first.body == json.dumps(BODY, separators=(",", ":")).encode()
    assert first.headers["Content-Type"] == "application/json"
    assert first.headers["X-Location-Id"] == "berlin"
    for retry in retries:
        assert (retry.method, retry.path, retry.body) == ("PUT", "/pay/", first.body)
        assert retry.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]


def test_each_operation_gets_its_own_key(kind: str) -> None:
    with Recorder() as api:
        client = Api(kind)
        for _ in range(2):
            client.post(f"{api.base}/pay/", content=b"x")
    assert len({seen.headers["Idempotency-Key"] for seen in api.seen}) == 2


def test_a_multipart_retry_sends_the_same_form(kind: str) -> None:
    fields: dict[str, Any] = {
        "slot": "2026-07-30T09:00",
        "ticket": ("ticket.pdf", b"%PDF-1.7 \x00\xff binary", "application/pdf"),
        "notes": ("notes.txt", b"window seat"),
    }
    with Recorder({"/upload/": [Answer(503)]}) as api:
        Api(kind, policy=NO_WAIT).post(f"{api.base}/upload/", multipart=fields)
    first, retry = api.seen
    assert (first.body, first.headers["Content-Type"]) == (
        retry.body,
        retry.headers["Content-Type"],
    )
    assert first.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    head = f"Content-Type: {first.headers['Content-Type']}\r\n\r\n".encode()
    form = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + first.body)
    parts = {
        part.get_param("name", header="content-disposition"): part for part in form.iter_parts()
    }
    assert parts["slot"].get_content() == "2026-07-30T09:00"
    ticket, notes = parts["ticket"], parts["notes"]
    assert (ticket.get_filename(), ticket.get_content_type()) == ("ticket.pdf", "application/pdf")
    assert ticket.get_payload(decode=True) == b"%PDF-1.7 \x00\xff binary"
    assert (notes.get_filename(), notes.get_content_type()) == (
        "notes.txt",
        "application/octet-stream",
    )
    with Recorder() as api:
        for _ in range(2):
            Api(kind).post(f"{api.base}/upload/", multipart=fields)
    assert api.seen[0].headers["Content-Type"] != api.seen[1].headers["Content-Type"]


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_refused_connection_is_retried_with_backoff_until_the_attempts_run_out(
    kind: str,
) -> None:
    fake = FakeTime()
    policy = RetryPolicy(attempts=4, base=1.0, cap=8.0, max_elapsed=100.0)
    api = Api(kind, sleep=fake.sleep, clock=fake.clock, jitter=lambda: 0.5, policy=policy)
    nobody = f"http://127.0.0.1:{free_port()}/api/bookings/"
    with pytest.raises(RetriesExhausted) as exhausted:
        api.post(nobody, json=BODY)
    assert api.sleeps == [0.5, 1.0, 2.0]
    error = exhausted.value
    assert error.attempts == 4 and error.status is None and error.response is None
    assert isinstance(error.error, (requests.ConnectionError, httpx.ConnectError))
    assert error.__cause__ is None  # its message is the whole URL
    assert re.search(r"no response \(\w+\) after 4 attempts in 3\.5 s", str(error))


def test_a_refused_connection_is_retried_until_the_time_runs_out(kind: str) -> None:
    fake = FakeTime()
    policy = RetryPolicy(attempts=100, base=1.0, cap=8.0, max_elapsed=10.0)
    api = Api(kind, sleep=fake.sleep, clock=fake.clock, jitter=lambda: 0.75, policy=policy)
    with pytest.raises(RetriesExhausted) as exhausted:
        api.post(f"http://127.0.0.1:{free_port()}/", content=b"x")
    assert api.sleeps == [0.75, 1.5, 3.0]  # then 6.0 would end at 11.25 s: past 10 s
    assert exhausted.value.attempts == 4


def test_a_retry_after_past_the_budget_stops_at_once(kind: str) -> None:
    busy = Answer(503, {"Retry-After": "5"})
    with Recorder({"/pay/": [busy]}) as api:
        client = Api(kind, policy=RetryPolicy(max_elapsed=3.0))
        with pytest.raises(RetriesExhausted) as exhausted:
            client.post(f"{api.base}/pay/", json=BODY)
    error = exhausted.value
    assert (error.status, error.retry_after, error.attempts) == (503, 5.0, 1)
    assert "retry later with the same key" in str(error) and "(Retry-After: 5 s)" in str(error)
    assert client.sleeps == [] and len(api.seen) == 1


def test_401_exchanges_the_credential_once_per_operation(kind: str) -> None:
    refused = Answer(401, {"WWW-Authenticate": "Bearer"})
    exchanges: list[str] = []

    def exchange() -> dict[str, str]:
        exchanges.append("fresh")
        return {"Authorization": "Bearer fresh"}

    with Recorder({"/pay/": [refused]}) as api:
        client = Api(kind, reauthenticate=exchange, headers={"Authorization": "Bearer old"})
        assert client.post(f"{api.base}/pay/", json=BODY).status_code == 201
    assert exchanges == ["fresh"] and client.sleeps == [0.0]
    assert [seen.headers["Authorization"] for seen in api.seen] == ["Bearer old", "Bearer fresh"]

    with (
        Recorder({"/pay/": [refused, refused]}) as api,
        pytest.raises(RequestRejected) as rejected,
    ):
        Api(kind, reauthenticate=exchange).post(f"{api.base}/pay/", json=BODY)
    assert (rejected.value.status, rejected.value.attempts) == (401, 2)
    assert exchanges == ["fresh", "fresh"]  # once per operation, then it is for a person


def test_an_answer_whose_key_the_server_ignored_is_not_retried(kind: str) -> None:
    ignored = Answer(502, {"Idempotency-Key-Ignored": "unprotected"})
    with Recorder({"/pay/": [ignored]}) as api:
        client = Api(kind)
        with pytest.raises(RequestRejected) as rejected:
            client.post(f"{api.base}/pay/", json=BODY)
    assert (rejected.value.status, rejected.value.attempts) == (502, 1)
    assert rejected.value.response.headers["Idempotency-Key-Ignored"] == "unprotected"
    assert len(api.seen) == 1 and client.sleeps == []


@pytest.mark.parametrize("status", [307, 308])
def test_the_client_never_sends_the_body_key_or_credentials_to_another_origin(
    kind: str, status: int
) -> None:
    """0d3b924 let requests/httpx follow a 307 to another host with body, key and X-Api-Key."""
    with Recorder() as elsewhere:
        target = f"http://localhost:{elsewhere.port}/collect/"  # another host: another origin
        with (
            Recorder({"/pay/": [Answer(status, {"Location": target})]}) as api,
            pytest.raises(RequestRejected) as rejected,
        ):
            Api(kind).post(f"{api.base}/pay/", json=BODY, key="pay-1", headers=SECRETS)
    assert elsewhere.seen == []
    assert len(api.seen) == 1
    assert rejected.value.status == status
    assert "another origin" in str(rejected.value)


@pytest.mark.parametrize(
    ("status", "reason"), [(301, "change the request"), (303, "change the request")]
)
def test_a_redirect_that_would_change_the_request_is_not_followed(
    kind: str, status: int, reason: str
) -> None:
    with (
        Recorder({"/pay/": [Answer(status, {"Location": "/v2/pay/"})]}) as api,
        pytest.raises(RequestRejected, match=reason),
    ):
        Api(kind).post(f"{api.base}/pay/", json=BODY)
    assert [seen.path for seen in api.seen] == ["/pay/"]


def test_the_client_follows_a_same_origin_307_with_body_and_key(kind: str) -> None:
    """The one redirect it follows keeps the method, the body, the key and the headers."""
    with Recorder() as api:
        # The old server sends the client to the new one (another port: another
        # origin): refused.
        moved = Answer(307, {"Location": f"{api.base}/v2/pay/"})
        with Recorder({"/pay/": [moved]}) as old, pytest.raises(RequestRejected):
            Api(kind).post(f"{old.base}/pay/", json=BODY, key="pay-2", headers=SECRETS)
        assert api.seen == []
    with Recorder({"/pay/": [Answer(308, {"Location": "/v2/pay/"})]}) as api:
        response = Api(kind).post(f"{api.base}/pay/", json=BODY, key="pay-3", headers=SECRETS)
        assert response.status_code == 201
        assert [seen.path for seen in api.seen] == ["/pay/", "/v2/pay/"]
        moved_to = api.seen[1]
        assert moved_to.headers["Idempotency-Key"] == "pay-3"
        assert moved_to.headers["X-Api-Key"] == "sk_live_secret"
        assert json.loads(moved_to.body) == BODY


def test_redirects_in_one_attempt_are_capped(kind: str) -> None:
    loop = [Answer(307, {"Location": "/pay/"})] * 10
    with (
        Recorder({"/pay/": loop}) as api,
        pytest.raises(RequestRejected, match="past 5 redirects") as rejected,
    ):
        Api(kind).post(f"{api.base}/pay/", json=BODY)
    assert len(api.seen) == 6 and rejected.value.attempts == 1


def test_the_client_logs_and_raises_without_the_urls_path_or_query(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """0d3b924 logged the path (a trigger token) and chained an error holding the query."""
    caplog.set_level(logging.DEBUG, logger="idempotency_client")
    token, query = "trg_8f2a61c0d9", "sig=deadbeefcafe"
    nobody = f"http://127.0.0.1:{free_port()}/hooks/{token}/?{query}"
    with pytest.raises(RetriesExhausted) as exhausted:
        Api(kind, policy=RetryPolicy(attempts=2, base=0.0, cap=0.0)).post(
            nobody, json=BODY, key="hook-1"
        )
    shown = "".join(traceback.format_exception(exhausted.value))
    ours = [r.getMessage() for r in caplog.records if r.name == "idempotency_client"]
    assert ours and "127.0.0.1" in ours[0]
    for text in [shown, *ours]:
        assert token not in text and query not in text and "/hooks/" not in text
    assert exhausted.value.error is not None  # the network error is still at hand


def test_logs_name_the_operation_by_a_digest_and_carry_no_secret(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger: the HTTP libraries' too
    key = "secret-key-5e0b"
    reused = Answer(
        409,
        {"Content-Type": "application/problem+json", "X-Request-Id": "req-77"},
        b'{"status": 409, "code": "idempotency_key_reused"}',
    )
    plan = [Answer(503), Answer(200, {"Idempotency-Replayed": "true"}), reused]
    with Recorder({"/pay/": plan}) as api:
        client = Api(kind, policy=NO_WAIT, headers=SECRETS)
        client.post(f"{api.base}/pay/", json=BODY, key=key)
        with pytest.raises(RequestRejected):
            client.post(f"{api.base}/pay/", json={**BODY, "amount": 1}, key=key)
    ours = [r for r in caplog.records if r.name == "idempotency_client"]
    assert [r.levelname for r in ours] == ["INFO", "DEBUG", "WARNING"]
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    assert all(f"[op {digest}]" in r.getMessage() for r in ours)
    assert "200 replayed" in ours[1].getMessage()
    assert "409 idempotency_key_reused (X-Request-Id req-77)" in ours[2].getMessage()
    for record in caplog.records:
        text = " ".join([record.getMessage(), repr(record.args), record.exc_text or ""])
        for secret in [key, "DE89370400440532013000", *SECRETS.values()]:
            assert secret not in text, (record.name, record.getMessage())


def test_a_network_error_that_is_not_a_blip_is_raised_at_once() -> None:
    with requests.Session() as session:
        api = IdempotentClient(session, sleep=lambda _: pytest.fail("no retry"))
        with pytest.raises(RequestRejected) as rejected:
            api.post("gopher://127.0.0.1/pay/?token=secret", json=BODY)
    assert isinstance(rejected.value.error, requests.exceptions.InvalidSchema)
    assert "/pay/" not in str(rejected.value) and "secret" not in str(rejected.value)


def test_bad_calls_are_refused_before_anything_is_sent() -> None:
    api = IdempotentClient(requests.Session())
    with pytest.raises(ValueError, match="unsafe"):
        api.request("GET", "http://127.0.0.1:1/")
    with pytest.raises(ValueError, match="key="):
        api.post("http://127.0.0.1:1/", headers={"idempotency-key": "k"})
    with pytest.raises(ValueError, match="not both"):
        api.post("http://127.0.0.1:1/", json={}, content=b"{}")
    with pytest.raises(ValueError, match="not both"):
        api.post("http://127.0.0.1:1/", json={}, multipart={"a": "b"})
    with pytest.raises(ValueError, match="boundary"):
        api.post("http://127.0.0.1:1/", multipart={"a": "b"}, headers={"Content-Type": "x"})
    with pytest.raises(ValueError, match="not both"):
        api.post("http://127.0.0.1:1/", location="a", headers={"X-Location-Id": "b"})
    with pytest.raises(ValueError, match="empty"):
        api.post("http://127.0.0.1:1/", key="")
    with pytest.raises(TypeError, match="AsyncIdempotentClient"):
        IdempotentClient(httpx.AsyncClient())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"requests\.Session or an httpx\.Client"):
        IdempotentClient(object())  # type: ignore[call-overload]


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_each_unsafe_method_has_its_call(kind: str, method: str) -> None:
    async def call_async(url: str) -> Any:
        async with httpx.AsyncClient() as client:
            return await getattr(AsyncIdempotentClient(client), method)(url, content=b"x")

    with Recorder() as api:
        url = f"{api.base}/items/1/"
        if kind == "httpx-async":
            response = asyncio.run(call_async(url))
        else:
            session = requests.Session() if kind == "requests" else httpx.Client()
            with session:
                response = getattr(IdempotentClient(session), method)(url, content=b"x")
    assert response.status_code == 201
    assert [(seen.method, seen.body) for seen in api.seen] == [(method.upper(), b"x")]


def test_a_non_blip_network_error_of_httpx_is_raised_at_once() -> None:
    async def call_async() -> None:
        async with httpx.AsyncClient() as client:
            await AsyncIdempotentClient(client).post("gopher://127.0.0.1/pay/", json=BODY)

    with pytest.raises(RequestRejected) as rejected:
        asyncio.run(call_async())
    assert isinstance(rejected.value.error, httpx.UnsupportedProtocol)


def test_a_body_of_ones_own_content_type_and_a_redirect_without_location(kind: str) -> None:
    bare = Answer(307)  # no Location: not a redirect to follow, the final answer
    with Recorder({"/pay/": [bare]}) as api:
        response = Api(kind).post(
            f"{api.base}/pay/", json=BODY, headers={"Content-Type": "application/vnd.api+json"}
        )
    assert response.status_code == 307
    assert api.seen[0].headers["Content-Type"] == "application/vnd.api+json"


def test_a_problem_body_that_is_not_json_has_no_code(kind: str) -> None:
    broken = Answer(409, {"Content-Type": "application/problem+json"}, b"<html>")
    with Recorder({"/pay/": [broken]}) as api, pytest.raises(RequestRejected) as rejected:
        Api(kind).post(f"{api.base}/pay/", json=BODY)
    assert (rejected.value.status, rejected.value.code) == (409, None)


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://user:secret@[::1]:8000/pay/?token=t", "POST http://[::1]:8000:"),
    ],
)
def test_messages_name_the_origin_only(url: str, origin: str) -> None:
    with requests.Session() as session:
        api = IdempotentClient(session, policy=RetryPolicy(attempts=1))
        with pytest.raises(IdempotentRequestError) as failed:
            api.post(url, json=BODY)
    assert str(failed.value).startswith(origin), str(failed.value)
    assert "secret" not in str(failed.value) and "/pay/" not in str(failed.value)


def test_an_origin_with_a_port_out_of_range_is_its_host() -> None:
    """The label is made before anything is sent; the library refuses such a URL itself."""
    from idempotency_client.operation import _origin

    assert _origin("http://127.0.0.1:99999/pay/?token=t") == "http://127.0.0.1"


# -- found by a review (2026-12-06): each of these failed before its fix -------------------


def test_a_location_hosts_are_read_differently_in_is_not_followed() -> None:
    """urllib.parse reads the host after the backslash's ``@``, urllib3 (requests) before
    it: the same origin to one is another host to the other."""
    redirect = Answer(307)
    with Recorder() as elsewhere, Recorder({"/pay/": [redirect]}) as api:
        redirect.headers["Location"] = f"http://localhost:{elsewhere.port}\\@127.0.0.1:{api.port}/"
        with requests.Session() as session, pytest.raises(RequestRejected, match="not followed"):
            session.headers.update(SECRETS)
            IdempotentClient(session).post(f"{api.base}/pay/", json=BODY)
    assert elsewhere.seen == []


def test_a_port_only_some_libraries_read_is_not_followed() -> None:
    """``:+8443`` under a base URL of the default port: urllib.parse cannot read the port
    (the origin would be the base's), httpx reads 8443, another port."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(307, headers={"Location": "http://api.test:+8443/pay/"})

    with (
        httpx.Client(transport=httpx.MockTransport(handler)) as client,
        pytest.raises(RequestRejected, match="not followed"),
    ):
        IdempotentClient(client).post("http://api.test/pay/", json=BODY)
    assert seen == ["http://api.test/pay/"]


def test_a_relative_redirect_is_followed_under_a_base_with_user_information(kind: str) -> None:
    """The user information is the base URL's, not the redirect's: same origin, followed."""
    redirect = Answer(307, {"Location": "/paid/"})
    with Recorder({"/pay/": [redirect]}) as api:
        base = api.base.replace("http://", "http://user:secret@")
        response = Api(kind).post(f"{base}/pay/", json=BODY)
    assert response.status_code == 201
    assert [seen.path for seen in api.seen] == ["/pay/", "/paid/"]


def test_a_body_that_is_not_bytes_is_refused_before_anything_is_sent(kind: str) -> None:
    """A stream would be read by the first attempt: the retry would send it empty."""
    stream = (part for part in [b'{"amount"', b":1}"])
    with Recorder() as api, pytest.raises(TypeError, match="bytes"):
        Api(kind).post(f"{api.base}/pay/", content=stream)  # type: ignore[typeddict-item]
    assert api.seen == []


def test_answers_in_progress_leave_the_attempts_to_those_that_may_have_run(kind: str) -> None:
    """Two 503s and four answers "in progress" are two attempts of five: retried on."""
    in_progress = Answer(409, {"Content-Type": "application/problem+json", "Retry-After": "1"})
    in_progress.body = b'{"status": 409, "code": "idempotency_key_in_progress"}'
    plan = [Answer(503), *[in_progress] * 4, Answer(503)]
    with Recorder({"/pay/": plan}) as api:
        response = Api(kind, policy=RetryPolicy(attempts=5), sleep=lambda _: None).post(
            f"{api.base}/pay/", json=BODY
        )
    assert (response.status_code, len(api.seen)) == (201, 7)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_fresh_credential_replaces_the_stale_one_whatever_its_case(flavour: str) -> None:
    sent: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get_list("authorization"))
        return httpx.Response(401 if len(sent) == 1 else 201)

    stale: dict[str, Any] = {"content": b"x", "headers": {"authorization": "Bearer old"}}
    if flavour == "sync":
        with httpx.Client(transport=httpx.MockTransport(handler)) as client:
            fresh = IdempotentClient(client, reauthenticate=lambda: {"Authorization": "Bearer new"})
            fresh.post("http://api.test/pay/", **stale)
    else:

        async def new() -> dict[str, str]:
            return {"Authorization": "Bearer new"}

        async def run() -> None:
            async def ahandler(request: httpx.Request) -> httpx.Response:
                return handler(request)

            async with httpx.AsyncClient(transport=httpx.MockTransport(ahandler)) as client:
                await AsyncIdempotentClient(client, reauthenticate=new).post(
                    "http://api.test/pay/", **stale
                )

        asyncio.run(run())
    assert sent == [["Bearer old"], ["Bearer new"]]


def test_a_retry_after_of_zero_waits_the_backoff(kind: str) -> None:
    """Answers "in progress" are bounded by time only: asked again at once, they would be
    asked in a loop until it runs out."""
    in_progress = Answer(409, {"Content-Type": "application/problem+json", "Retry-After": "0"})
    in_progress.body = b'{"status": 409, "code": "idempotency_key_in_progress"}'
    waits: list[float] = []
    with Recorder({"/pay/": [in_progress, in_progress]}) as api:
        Api(kind, policy=RetryPolicy(base=0.5), sleep=waits.append, jitter=lambda: 0.5).post(
            f"{api.base}/pay/", json=BODY
        )
    assert waits == [0.25, 0.5]  # full jitter's draw of 0.5, after attempts 1 and 2


@pytest.mark.parametrize("kind", ["requests", "httpx"])
def test_a_refused_certificate_is_not_retried_and_its_error_names_no_path(kind: str) -> None:
    with Recorder() as api:  # it speaks HTTP, not TLS
        url = f"https://127.0.0.1:{api.port}/hooks/trg_secret/?sig=deadbeef"
        with pytest.raises(RequestRejected) as rejected:
            Api(kind, sleep=lambda _: pytest.fail("no retry")).post(url, content=b"x")
    assert "trg_secret" not in str(rejected.value) and "deadbeef" not in str(rejected.value)
    assert rejected.value.error is not None
