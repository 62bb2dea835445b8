"""The fingerprint of a multipart body: its parts, wherever the body's chunks split it, and
the raw bytes when the body is not the multipart its Content-Type says.

Each body goes through the test client to a form view behind the middleware, which
answers with what Django's parser gave it.
"""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from idempotency_django.protocol.bodies import CHUNK_SIZE
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

SLOT = b'Content-Disposition: form-data; name="slot"'
ATTACHMENT = (
    b'Content-Disposition: form-data; name="attachment"; filename="slots.bin"\r\n'
    b"Content-Type: application/octet-stream"
)
#: Two boundaries of one length, so that the chunks split both bodies at the same place.
BOUNDARIES = (b"first-boundary-a1b2", b"retry-boundary-z9y8")


def post(client: Client, body: bytes, content_type: str, key: str, url: str = "/plain/form/"):  # type: ignore[no-untyped-def]
    return client.post(url, body, content_type=content_type, HTTP_IDEMPOTENCY_KEY=key)


def upload_form(boundary: bytes, size: int, *, preamble: bytes = b"", last: bytes = b"x") -> bytes:
    """An attachment of ``size`` bytes (ending with ``last``) and a slot field."""
    return (
        (preamble + b"\r\n" if preamble else b"")
        + b"--" + boundary + b"\r\n" + ATTACHMENT + b"\r\n\r\n"
        + b"x" * (size - 1) + last
        + b"\r\n--" + boundary + b"\r\n" + SLOT + b"\r\n\r\n09:00"
        + b"\r\n--" + boundary + b"--\r\n"
    )  # fmt: skip


def attachment_size(split: str, boundary: bytes) -> int:
    """The attachment's size that puts the end of the first chunk where ``split`` says."""
    head = len(b"--" + boundary + b"\r\n" + ATTACHMENT + b"\r\n\r\n")
    delimiter_end = CHUNK_SIZE - head - len(b"\r\n--" + boundary)
    return {"preamble": 1000, "delimiter": delimiter_end, "headers": delimiter_end - 10}[split]


#: A preamble (which Django ignores) longer than a chunk: paragraphs of text.
LONG_PREAMBLE = b"This is a multi-part message in MIME format.\r\n\r\n" * (CHUNK_SIZE // 40)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=4096)  # the body is streamed in chunks
@pytest.mark.parametrize(
    "split",
    ["preamble", "delimiter", "headers"],
    ids=["in-the-preamble", "right-after-a-delimiter", "in-a-parts-headers"],
)
def test_a_streamed_multipart_retry_replays_wherever_a_chunk_ends(
    alice_client: Client, split: str
) -> None:
    """The same form under another boundary is the same request, wherever a chunk of the
    body ends; the attachment's last byte, next to that end, still counts."""
    size = attachment_size(split, BOUNDARIES[0])
    preamble = LONG_PREAMBLE if split == "preamble" else b""

    def send(boundary: bytes, last: bytes = b"x"):  # type: ignore[no-untyped-def]
        body = upload_form(boundary, size, preamble=preamble, last=last)
        return post(alice_client, body, f"multipart/form-data; boundary={boundary.decode()}", split)

    first = send(BOUNDARIES[0])
    assert first.status_code == 201, first.content[:300]
    assert first.json()["attachment_size"] == size and first.json()["slot"] == "09:00"
    retry = send(BOUNDARIES[1])
    assert retry.status_code == 201
    assert retry["Idempotency-Replayed"] == "true"
    assert retry.content == first.content
    changed = send(BOUNDARIES[1], last=b"y")
    assert changed.status_code == 409
    assert changed.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


def slot_form(boundary: str) -> bytes:
    return f'--{boundary}\r\nContent-Disposition: form-data; name="slot"\r\n\r\n09:00'.encode()


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data; boundary={b}", "--{b}\r\nX-Junk\r\n{slot}\r\n\r\n09:00\r\n--{b}--"),
        (
            "multipart/form-data; boundary={b}",
            "--{b}\r\nContent-Type: text/plain\r\n\r\nno name\r\n--{b}\r\n{slot}\r\n\r\n09:00"
            "\r\n--{b}--",
        ),
        ("multipart/form-data; boundary={b}", "--{b}\r\n{slot}\r\n\r\n09:00\r\n--{b}"),
        ("multipart/form-data; boundary={b}", "--{b}\r\n{slot}\r\n\r\n09:00\r\n--{b}\r\n{slot}"),
        ("multipart/form-data", "--{b}\r\n{slot}\r\n\r\n09:00\r\n--{b}--"),
        ("multipart/form-data; boundary={b}", "--{b} X: y\r\n{slot}\r\n\r\n09:00\r\n--{b}--"),
    ],
    ids=[
        "a-header-line-without-a-colon",
        "a-part-without-a-name",
        "ends-inside-a-delimiter",
        "ends-inside-a-parts-headers",
        "no-boundary-parameter",
        "a-header-line-in-the-transport-padding",
    ],
)
def test_a_body_that_is_not_the_multipart_it_claims_counts_byte_for_byte(
    alice_client: Client, content_type: str, body: str
) -> None:
    """Django's parser may still find a form in it, but the fingerprint does not: the same
    bytes replay, the same parts under another boundary are another request."""
    slot = SLOT.decode()
    # A multipart body without a boundary would be refused by Django's parser: a view
    # that does not read its body.
    url = "/plain/form/" if "boundary" in content_type else "/plain/large/"

    def send(boundary: str):  # type: ignore[no-untyped-def]
        data = body.format(b=boundary, slot=slot).encode()
        return post(alice_client, data, content_type.format(b=boundary), "raw", url)

    first = send("b-1")
    assert first.status_code == 201, first.content[:300]
    if url == "/plain/form/":
        assert first.json()["slot"] == "09:00"  # Django's parser found the form
    again = send("b-1")
    assert again["Idempotency-Replayed"] == "true"
    other = send("b-2")
    assert other.status_code == 409
    assert other.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


@pytest.mark.parametrize(
    ("sent", "retried"),
    [
        # A slot part in the epilogue, after the closing delimiter.
        (
            "--b-1\r\n{slot}\r\n\r\n09:00\r\n--b-1--\r\n",
            "--b-1\r\n{slot}\r\n\r\n09:00\r\n--b-1--\r\n--b-1\r\n{slot}\r\n\r\n23:00\r\n--b-1--",
        ),
        # A delimiter without the CRLF before it, within the slot's value.
        (
            "--b-2\r\n{slot}\r\n\r\n09:00--b-1\r\n{slot}\r\n\r\n23:00\r\n--b-2--\r\n",
            "--b-1\r\n{slot}\r\n\r\n09:00--b-1\r\n{slot}\r\n\r\n23:00\r\n--b-1--\r\n",
        ),
        # An attachment in the preamble, before the first delimiter.
        (
            "--b-1\r\n{slot}\r\n\r\n09:00\r\n--b-1--\r\n",
            "{attachment}\r\n\r\nfile\r\n--b-1\r\n{slot}\r\n\r\n09:00\r\n--b-1--\r\n",
        ),
    ],
    ids=[
        "a-part-after-the-closing-delimiter",
        "a-delimiter-without-crlf",
        "a-file-in-the-preamble",
    ],
)
def test_a_body_django_reads_as_another_form_is_another_request(
    alice_client: Client, sent: str, retried: str
) -> None:
    """The same key with a body whose form (as the view gets it) differs is refused."""

    def send(body: str):  # type: ignore[no-untyped-def]
        boundary = "b-2" if body.startswith("--b-2") else "b-1"
        data = body.format(slot=SLOT.decode(), attachment=ATTACHMENT.decode()).encode()
        return post(alice_client, data, f"multipart/form-data; boundary={boundary}", "differs")

    first = send(sent)
    assert first.status_code == 201, first.content[:300]
    retry = send(retried)
    assert retry.status_code == 409, (first.json(), retry.json())
    assert retry.json()["code"] == "idempotency_key_reused"
