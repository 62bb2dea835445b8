"""The retry client's multipart= body: built once per operation, the same bytes on
every attempt, and a form Django parses (no server: the transports are fakes)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import requests
from django.core.files.uploadedfile import UploadedFile
from django.test import RequestFactory
from requests.adapters import BaseAdapter

from idempotency_client import IdempotentClient, RetryPolicy

FIELDS: dict[str, Any] = {
    "slot": "2026-07-30T09:00",
    "ticket": ("ticket.pdf", b"%PDF-1.7 \x00\xff binary", "application/pdf"),
    "notes": ("notes.txt", b"window seat"),
}
POLICY = RetryPolicy(attempts=3, base=0.0, cap=0.0)


def _as_bytes(body: bytes | str | None) -> bytes:
    assert isinstance(body, bytes), body  # a multipart body is bytes
    return body


class FlakyAdapter(BaseAdapter):
    """503 on the first attempt, then 201; keeps every request it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(  # type: ignore[override]  # requests' stub names every keyword; a test adapter takes any
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        self.sent.append(request)
        response = requests.Response()
        response.status_code = 503 if len(self.sent) == 1 else 201
        response._content = b"{}"
        response.request = request
        return response

    def close(self) -> None:
        pass


def sent_with_requests() -> list[tuple[bytes, str]]:
    session = requests.Session()
    adapter = FlakyAdapter()
    session.mount("http://api.test/", adapter)
    api = IdempotentClient(session, policy=POLICY, sleep=lambda _: None)
    assert api.post("http://api.test/upload/", multipart=FIELDS).status_code == 201
    return [(_as_bytes(r.body), r.headers["Content-Type"]) for r in adapter.sent]


def sent_with_httpx() -> list[tuple[bytes, str]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(503 if len(sent) == 1 else 201, json={})

    session = httpx.Client(transport=httpx.MockTransport(handler))
    api = IdempotentClient(session, policy=POLICY, sleep=lambda _: None)
    assert api.post("http://api.test/upload/", multipart=FIELDS).status_code == 201
    return [(r.read(), r.headers["Content-Type"]) for r in sent]


@pytest.mark.parametrize("send", [sent_with_requests, sent_with_httpx], ids=["requests", "httpx"])
def test_a_multipart_retry_sends_the_same_bytes(send: Any) -> None:
    first, retry = send()
    assert first == retry
    body, content_type = first
    assert content_type.startswith("multipart/form-data; boundary=")
    request = RequestFactory().generic("POST", "/upload/", body, content_type=content_type)
    assert request.POST["slot"] == "2026-07-30T09:00"
    ticket, notes = request.FILES["ticket"], request.FILES["notes"]
    assert isinstance(ticket, UploadedFile) and isinstance(notes, UploadedFile)
    assert (ticket.name, ticket.content_type, ticket.read()) == (
        "ticket.pdf",
        "application/pdf",
        b"%PDF-1.7 \x00\xff binary",
    )
    assert (notes.name, notes.content_type, notes.read()) == (
        "notes.txt",
        "application/octet-stream",
        b"window seat",
    )


def test_two_operations_get_two_boundaries_and_multipart_sets_its_own_type() -> None:
    assert sent_with_requests()[0][1] != sent_with_requests()[0][1]
    api = IdempotentClient(requests.Session())
    with pytest.raises(ValueError, match="not both"):
        api.post("http://127.0.0.1:1/", json={}, multipart=FIELDS)
    with pytest.raises(ValueError, match="boundary"):
        api.post(
            "http://127.0.0.1:1/", multipart=FIELDS, headers={"Content-Type": "multipart/form-data"}
        )
