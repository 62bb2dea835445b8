"""Every body Django accepts works with a key: forms with CSRF, JSON, uploads of any size.

Users log in through the login view and CSRF is enforced, as in production;
the key is the only difference between these requests and a browser's.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest
from django.test import Client, override_settings
from django.test.client import encode_multipart
from django.urls import ResolverMatch
from django.utils.crypto import salted_hmac
from django.utils.http import urlencode

from idempotency_django.models import IdempotencyRecord
from idempotency_django.protocol import bodies, fingerprint, marks, routes
from idempotency_django.protocol.fingerprint import FINGERPRINT_SALT
from tests.testapp.models import Booking

pytestmark = pytest.mark.django_db

#: Small, so that a modest upload is over it: the request must still work with a key.
MEMORY_LIMIT = 4 * 1024
UPLOAD = bytes(range(256)) * 64  # 16 KiB of every byte value
URLENCODED = "application/x-www-form-urlencoded"


class Browser:
    """A session client that logged in through the login form and sends CSRF tokens."""

    def __init__(self, user: User, password: str) -> None:
        self.client = Client(enforce_csrf_checks=True)
        page = self.client.get("/admin/login/")
        field = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
        assert field is not None
        login = self.client.post(
            "/admin/login/",
            {
                "csrfmiddlewaretoken": field.group(1),
                "username": user.username,
                "password": password,
            },
        )
        assert login.status_code == 302, "the login form refused the user"
        self.csrf = self.client.cookies["csrftoken"].value

    def post_form(self, url: str, data: dict, *, key: str, token_in: str, multipart: bool):  # type: ignore[no-untyped-def,type-arg]
        headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": key}
        if token_in == "field":
            data = {**data, "csrfmiddlewaretoken": self.csrf}
        else:
            headers["HTTP_X_CSRFTOKEN"] = self.csrf
        if multipart:
            return self.client.post(url, data, **headers)  # multipart, as a browser sends it
        form = urlencode(data)
        return self.client.post(url, form, content_type=URLENCODED, **headers)

    def post_json(self, url: str, payload: dict, *, key: str):  # type: ignore[no-untyped-def,type-arg]
        return self.client.post(
            url,
            json.dumps(payload),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_X_CSRFTOKEN=self.csrf,
        )


@pytest.fixture
def browser(alice: User) -> Browser:
    alice.is_staff = True  # the admin's login form is the login view at hand
    alice.save()
    return Browser(alice, "alice-password")


def upload() -> object:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("slots.bin", UPLOAD, content_type="application/octet-stream")


@pytest.mark.parametrize("url", ["/plain/form/", "/api/form/"])
@pytest.mark.parametrize("multipart", [False, True], ids=["urlencoded", "multipart"])
@pytest.mark.parametrize("token_in", ["field", "header"])
def test_a_form_posted_with_a_key_runs_once(
    browser: Browser, url: str, multipart: bool, token_in: str
) -> None:
    data = {"slot": "2026-07-30T09:00:00Z"}
    first = browser.post_form(url, data, key="form-1", token_in=token_in, multipart=multipart)
    assert first.status_code == 201, first.content[:300]
    again = browser.post_form(url, data, key="form-1", token_in=token_in, multipart=multipart)
    assert again.status_code == 201
    assert again["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("url", ["/plain/bookings/", "/api/book/"])
def test_json_with_the_csrf_header_runs_once(browser: Browser, url: str) -> None:
    payload = {"slot": "2026-07-30T09:00:00Z", "customer": "Dana"}
    assert browser.post_json(url, payload, key="json-1").status_code == 201
    assert browser.post_json(url, payload, key="json-1")["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=MEMORY_LIMIT, FILE_UPLOAD_MAX_MEMORY_SIZE=1024)
@pytest.mark.parametrize("url", ["/plain/form/", "/api/form/"])
def test_an_upload_over_the_memory_limit_works_with_a_key(browser: Browser, url: str) -> None:
    """Larger than DATA_UPLOAD_MAX_MEMORY_SIZE: streamed to the view, hashed on the way."""
    data = {"slot": "upload", "attachment": upload()}
    first = browser.post_form(url, data, key="up-1", token_in="header", multipart=True)
    assert first.status_code == 201, first.content[:300]
    assert first.json()["attachment_sha256"] == hashlib.sha256(UPLOAD).hexdigest()
    replay = browser.post_form(
        url, {**data, "attachment": upload()}, key="up-1", token_in="header", multipart=True
    )
    assert replay["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1

    other = upload()
    other.file.write(b"one more byte")  # type: ignore[attr-defined]
    other.file.seek(0)  # type: ignore[attr-defined]
    changed = browser.post_form(
        url, {**data, "attachment": other}, key="up-1", token_in="header", multipart=True
    )
    assert changed.status_code == 409
    assert changed.json()["code"] == "idempotency_key_reused"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=MEMORY_LIMIT)
def test_the_fingerprint_of_a_multipart_body_is_the_one_of_its_parts(browser: Browser) -> None:
    """HMAC-SHA256(method, path, canonical form): one line per part, its name, filename,
    content type and the SHA-256 of its content; streamed when the body is over the memory
    limit."""
    body = encode_multipart("a-boundary", {"slot": "fp", "attachment": upload()})
    assert len(body) > MEMORY_LIMIT
    response = browser.client.post(
        "/plain/form/?x=1",
        body,
        content_type="multipart/form-data; boundary=a-boundary",
        HTTP_IDEMPOTENCY_KEY="fp-1",
        HTTP_X_CSRFTOKEN=browser.csrf,
    )
    assert response.status_code == 201
    parts = [
        ["slot", None, "", [], "", hashlib.sha256(b"fp").hexdigest()],
        ["attachment", "slots.bin", "application/octet-stream", [], "", sha256(UPLOAD)],
    ]
    canonical = b"multipart/form-data\n" + b"".join(
        json.dumps(part, separators=(",", ":")).encode() + b"\n" for part in parts
    )
    message = b"POST\n/plain/form/?x=1\n" + canonical
    expected = salted_hmac(FINGERPRINT_SALT, message, algorithm="sha256").hexdigest()
    assert IdempotencyRecord.objects.get().fingerprint == expected


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def post_multipart(browser: Browser, url: str, boundary: str, data: dict, key: str):  # type: ignore[no-untyped-def,type-arg]
    """A multipart body as curl -F or a browser's FormData sends it, with this boundary."""
    return browser.client.post(
        url,
        encode_multipart(boundary, data),
        content_type=f"multipart/form-data; boundary={boundary}",
        HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_CSRFTOKEN=browser.csrf,
    )


@pytest.mark.parametrize("limit", [None, MEMORY_LIMIT], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("url", ["/plain/form/", "/api/form/"])
def test_a_multipart_retry_with_a_new_boundary_replays(
    browser: Browser, url: str, limit: int | None
) -> None:
    """curl, FormData and most clients pick a new boundary per request: a retry of the
    same form must replay, and the same key with another value is still refused."""
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=limit or 2_621_440):
        form = {"slot": "2026-07-30T09:00:00Z", "attachment": upload()}
        first = post_multipart(browser, url, "------------------------a1b2c3", form, "mp-1")
        assert first.status_code == 201, first.content[:300]
        form["attachment"] = upload()
        retry = post_multipart(browser, url, "----WebKitFormBoundaryZ9", form, "mp-1")
        assert retry.status_code == 201, retry.content[:300]
        assert retry["Idempotency-Replayed"] == "true"
        assert retry.content == first.content
        changed = {"slot": "2026-07-31T09:00:00Z", "attachment": upload()}
        reused = post_multipart(browser, url, "------------------------d4e5f6", changed, "mp-1")
        assert reused.status_code == 409
        assert reused.json()["code"] == "idempotency_key_reused"
    assert Booking.objects.count() == 1


@pytest.mark.parametrize(
    ("other", "why"),
    [
        ({"attachment": ("other.bin", UPLOAD)}, "filename"),
        ({"attachment": ("slots.bin", UPLOAD + b"!")}, "content"),
        ({"attachment": ("slots.bin", UPLOAD), "extra": "x"}, "one more part"),
    ],
    ids=["filename", "content", "extra-part"],
)
def test_a_different_part_is_a_different_request(
    browser: Browser,
    other: dict[str, Any],
    why: str,
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    def form(fields: dict) -> dict:  # type: ignore[type-arg]
        return {
            "slot": "2026-07-30T09:00:00Z",
            **{
                name: SimpleUploadedFile(value[0], value[1]) if isinstance(value, tuple) else value
                for name, value in fields.items()
            },
        }

    first = post_multipart(
        browser, "/plain/form/", "b-1", form({"attachment": ("slots.bin", UPLOAD)}), "mp-2"
    )
    assert first.status_code == 201
    second = post_multipart(browser, "/plain/form/", "b-2", form(other), "mp-2")
    assert second.status_code == 409, why


def test_a_body_that_is_not_the_multipart_it_claims_counts_byte_for_byte() -> None:
    """No closing delimiter: Django would not find the parts, so neither does the
    fingerprint; the raw bytes count, boundary and all."""
    from django.test import RequestFactory

    from idempotency_django.protocol.fingerprint import default_fingerprint

    body = b'--b-1\r\nContent-Disposition: form-data; name="slot"\r\n\r\nfp'
    request = RequestFactory().post(
        "/plain/form/", body, content_type="multipart/form-data; boundary=b-1"
    )
    message = b"POST\n/plain/form/\n" + body
    expected = salted_hmac(FINGERPRINT_SALT, message, algorithm="sha256").hexdigest()
    assert default_fingerprint(request) == expected


def test_a_body_without_a_key_is_left_alone(browser: Browser) -> None:
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=MEMORY_LIMIT):
        data = {"slot": "no key", "attachment": upload(), "csrfmiddlewaretoken": browser.csrf}
        response = browser.client.post("/plain/form/", data)
    assert response.status_code == 201
    assert not IdempotencyRecord.objects.exists()


def without_the_middleware(browser: Browser, settings: Any) -> None:
    logged_in = browser.client
    settings.MIDDLEWARE = [
        name
        for name in settings.MIDDLEWARE
        if name != "idempotency_django.middleware.IdempotencyMiddleware"
    ]
    browser.client = Client(enforce_csrf_checks=True)  # a handler built with these MIDDLEWARE
    browser.client.cookies = logged_in.cookies


@pytest.mark.parametrize(
    ("url", "multipart"),
    [("/api/bookings/", False), ("/api/bookings/", True)],
    ids=["json", "multipart"],
)
def test_a_drf_view_readies_the_body_without_the_middleware(
    browser: Browser, settings: Any, multipart: bool, url: str
) -> None:
    """A project without IdempotencyMiddleware: the view readies the body itself, before
    SessionAuthentication's CSRF check parses (and consumes) the stream."""
    without_the_middleware(browser, settings)
    form: dict[str, Any] = {"slot": "2026-08-01T09:00:00Z", "customer": "alice"}

    def send(boundary: str):  # type: ignore[no-untyped-def]
        if multipart:
            form["attachment"] = upload()
            return post_multipart(browser, url, boundary, form, "no-mw-1")
        return browser.client.post(
            url,
            json.dumps(form),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="no-mw-1",
            HTTP_X_CSRFTOKEN=browser.csrf,
        )

    first = send("first-boundary")
    assert first.status_code == 201, first.content[:300]
    retry = send("second-boundary")
    assert retry.status_code == 201, retry.content[:300]
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("url", ["/api/bookings/", "/plain/bookings/"])
def test_a_keyed_request_resolves_reads_its_key_and_readies_its_body_once(
    browser: Browser, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Issue 36: the middleware resolves the URL, reads the key header and readies the
    body; the DRF view and phase 1 are handed each, and the fingerprint's parts are
    built once. Counted where every module of the library calls them."""
    calls: dict[str, list[object]] = {"match_of": [], "key": [], "ready_body": [], "parts": []}
    original = {name: getattr(module, name) for module, name in (
        (routes, "match_of"), (marks, "meta_name"), (bodies, "ready_body"),
        (fingerprint, "keyed_digest"),
    )}  # fmt: skip

    def match_of(request: HttpRequest) -> ResolverMatch | None:
        calls["match_of"].append(request.path)
        return original["match_of"](request)  # type: ignore[no-any-return]

    def meta_name(name: str) -> str:  # every reader of a header looks its META name up
        if name == "Idempotency-Key":
            calls["key"].append(name)
        return original["meta_name"](name)  # type: ignore[no-any-return]

    def ready_body(request: HttpRequest, match: ResolverMatch | None) -> Any:
        calls["ready_body"].append(request.path)
        return original["ready_body"](request, match)

    def keyed_digest(parts: Any) -> Any:
        calls["parts"].append(parts)
        return original["keyed_digest"](parts)

    replacements = {"match_of": match_of, "meta_name": meta_name, "ready_body": ready_body}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("idempotency_django"):
            for name, replacement in replacements.items():
                if getattr(module, name, None) is original[name]:
                    monkeypatch.setattr(module, name, replacement)
    monkeypatch.setattr(fingerprint, "keyed_digest", keyed_digest)
    response = browser.client.post(
        url,
        json.dumps({"slot": "2026-08-02T09:00:00Z", "customer": "alice"}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="once-1",
        HTTP_X_CSRFTOKEN=browser.csrf,
    )
    assert response.status_code == 201, response.content[:300]
    assert {name: len(made) for name, made in calls.items()} == {
        "match_of": 1,
        "key": 1,
        "ready_body": 1,
        "parts": 1,
    }


def test_without_the_middleware_an_api_view_refuses_a_multipart_body_it_cannot_fingerprint(
    browser: Browser, settings: Any
) -> None:
    """``@idempotent`` below ``@api_view`` and no middleware: SessionAuthentication's CSRF
    check parses the upload first. The request is refused, and nothing runs
    (docs/drf.md says to keep the middleware)."""
    without_the_middleware(browser, settings)
    form: dict[str, Any] = {"slot": "2026-08-01T09:00:00Z", "attachment": upload()}
    response = post_multipart(browser, "/api/form/", "a-boundary", form, "no-mw-form")
    assert response.status_code == 400
    assert response.json()["code"] == "idempotency_body_unavailable"
    assert not Booking.objects.exists()
    assert not IdempotencyRecord.objects.exists()


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=MEMORY_LIMIT)
@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("/plain/bookings/", "json"),
        ("/api/bookings/", "json"),
        ("/plain/form/", "upload"),
        ("/api/form/", "upload"),
    ],
)
def test_a_body_cut_short_is_refused_before_the_key_is_claimed(
    browser: Browser, url: str, kind: str
) -> None:
    """Fewer bytes than ``Content-Length``, as a WSGI server hands over the body of a
    client that hung up mid-upload: refused ``400 idempotency_body_incomplete``, nothing
    claimed or run; the whole request then runs once. A JSON body is read in memory, an
    upload over the memory limit copied to a file: both are checked. (The real hang-up,
    under gunicorn: tests/test_hangup_matrix.py.)"""
    if kind == "json":
        body = json.dumps({"slot": "2026-08-03T09:00:00Z", "customer": "alice"}).encode()
        content_type = "application/json"
    else:
        body = encode_multipart(
            "b0undary", {"slot": "2026-08-03T09:00:00Z", "attachment": upload()}
        )
        content_type = "multipart/form-data; boundary=b0undary"
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": "cut-1", "HTTP_X_CSRFTOKEN": browser.csrf}
    arrived = io.BytesIO(body[: len(body) // 2])  # what came before the connection dropped
    cut = browser.client.post(
        url, body, content_type=content_type, **{**headers, "wsgi.input": arrived}
    )
    assert cut.status_code == 400, cut.content[:300]
    assert cut["Content-Type"] == "application/problem+json", cut.content[:300]
    assert cut.json()["code"] == "idempotency_body_incomplete"
    assert cut.json()["detail"] == (
        f"The request body ended before its Content-Length of {len(body)} bytes."
    )
    assert not Booking.objects.exists()
    assert not IdempotencyRecord.objects.exists()

    whole = browser.client.post(url, body, content_type=content_type, **headers)
    assert whole.status_code == 201, whole.content[:300]
    assert "Idempotency-Replayed" not in whole
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("kind", ["json", "upload"])
def test_without_the_middleware_a_drf_view_runs_nothing_on_a_body_cut_short(
    browser: Browser, settings: Any, kind: str
) -> None:
    """No IdempotencyMiddleware: SessionAuthentication's CSRF check has DRF parse the body
    before the key is claimed, and DRF refuses the part that arrived (its own 400). Nothing
    is claimed or run either way; keep the middleware for the problem answer."""
    without_the_middleware(browser, settings)
    if kind == "json":
        url, body = "/api/bookings/", json.dumps({"slot": "2026-08-04T09:00:00Z", "customer": "a"})
        content_type = "application/json"
        encoded = body.encode()
    else:
        url, content_type = "/api/bookings/", "multipart/form-data; boundary=b0undary"
        encoded = encode_multipart(
            "b0undary", {"slot": "2026-08-04T09:00:00Z", "customer": "a", "attachment": upload()}
        )
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": "cut-2", "HTTP_X_CSRFTOKEN": browser.csrf}
    arrived = io.BytesIO(encoded[: len(encoded) // 2])
    cut = browser.client.post(
        url, encoded, content_type=content_type, **{**headers, "wsgi.input": arrived}
    )
    assert cut.status_code == 400, cut.content[:300]
    assert not Booking.objects.exists()
    assert not IdempotencyRecord.objects.exists()
    whole = browser.client.post(url, encoded, content_type=content_type, **headers)
    assert whole.status_code == 201, whole.content[:300]
    assert Booking.objects.count() == 1
