"""Test helpers for projects that use idempotency-django, and the pytest plugin that offers them.

Installing the package registers this module with pytest (entry point
``idempotency_django`` in ``pytest11``), so every test suite of a project that
uses it gets two fixtures:

``idempotency_store``
    The configured store, emptied before and after the test.
``no_idempotency``
    The protection turned off for the test (``IDEMPOTENCY["ENABLED"] = False``),
    through pytest-django's ``settings`` fixture.

The helpers work without pytest too (in a Django ``TestCase``, say):
[`assert_idempotent`][idempotency_django.testing.assert_idempotent],
[`clear_store`][idempotency_django.testing.clear_store] and
[`idempotency_disabled`][idempotency_django.testing.idempotency_disabled].

pytest loads this module in every project the package is installed in, Django
project or not, before Django is configured: nothing from Django is imported
until a helper runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from django.http import HttpRequest
    from django.http.response import HttpResponseBase
    from django.test import Client, override_settings
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

    from idempotency_django.stores import BaseStore

try:
    import pytest
except ImportError:  # the helpers need no pytest; only the fixtures do
    _HAVE_PYTEST = False
else:
    _HAVE_PYTEST = True

__all__ = ["OTHER_REQUEST_FIELD", "assert_idempotent", "clear_store", "idempotency_disabled"]

#: Added to a dict ``data`` to make the different request of the reused-key check.
OTHER_REQUEST_FIELD = "_assert_idempotent"


def assert_idempotent(
    client: Client,
    method: str,
    url: str,
    data: Any = None,
    *,
    other_data: Any = None,
    key: str | None = None,
    content_type: str = "application/json",
    **extra: Any,
) -> TestResponse:
    """Check the key contract on a view; return the first response.

    Sends, with ``client`` (Django's ``Client`` or DRF's ``APIClient``, logged in:
    keys are scoped per user):

    1. the request with a new key (or ``key``). While it holds the key, before its
       view runs, a duplicate is sent from the ``reserved`` signal; the duplicate
       must get ``409 idempotency_key_in_progress`` with ``Retry-After``. The
       first must not be answered from the store;
    2. the same request again: a replay, ``Idempotency-Replayed: true``, with the
       first response's status, ``Content-Type`` and body;
    3. the same key with ``other_data``: ``idempotency_key_reused`` with the
       ``REUSE_STATUS`` setting's status.

    The view runs once, for the first request. ``data`` is sent as it is when it is
    bytes or text; a dict (or list) is JSON-encoded for a JSON ``content_type``,
    multipart-encoded for ``multipart/form-data`` and form-encoded otherwise.
    ``other_data`` defaults to ``data`` (a dict, or none) with one more field,
    ``OTHER_REQUEST_FIELD``; pass it for any other ``data``, or when the view's
    fingerprint ignores that field. ``extra`` goes to ``client.generic`` (WSGI
    environ entries such as ``HTTP_X_CSRFTOKEN``, ``headers=``, ``secure=``).
    """
    from idempotency_django.conf import idempotency_settings
    from idempotency_django.protocol import problems

    method = method.upper()
    body, sent_content_type = _encode(data, content_type)
    if other_data is None:
        other_data = _another_request(data)
    other_body, _ = _encode(other_data, content_type)
    if other_body == body:
        raise ValueError("other_data must differ from data: it is a different request.")
    key = key or f"assert-idempotent-{uuid.uuid4().hex}"
    header = idempotency_settings.HEADER
    environ_name = "HTTP_" + header.upper().replace("-", "_")
    replayed = idempotency_settings.MARKER_HEADERS.replayed

    def send(payload: bytes) -> TestResponse:
        return client.generic(
            method, url, payload, content_type=sent_content_type, **{**extra, environ_name: key}
        )

    first, duplicate = _send_with_a_duplicate(send, body, header, key)
    if first.has_header(replayed) or _code(first).startswith("idempotency_"):
        raise AssertionError(
            f"The first {method} {url} did not run the view: it got {_describe(first)}. "
            "If the key was used before, start from an empty store (the idempotency_store "
            "fixture, or clear_store()) or pass a new key=."
        )
    if duplicate is None:
        raise AssertionError(
            f"{method} {url} never claimed its key, so nothing protects it; it got "
            f"{_describe(first)}. Is the view protected (IdempotencyMiddleware or "
            "@idempotent, not exempt), is the client logged in (an anonymous keyed request "
            "runs unprotected by default), is the method in IDEMPOTENCY['METHODS'] and "
            "IDEMPOTENCY['ENABLED'] on?"
        )
    if (
        duplicate.status_code != 409
        or _code(duplicate) != problems.KEY_IN_PROGRESS
        or not duplicate.has_header("Retry-After")
    ):
        raise AssertionError(
            "A duplicate sent while the first request held its key got "
            f"{_describe(duplicate)}; expected 409 {problems.KEY_IN_PROGRESS} with Retry-After."
        )

    retry = send(body)
    if retry.get(replayed) != "true":
        raise AssertionError(
            f"The retry (same key, method, URL and body) was not replayed: it got "
            f"{_describe(retry)}, after the first request got {_describe(first)}. "
            "A response is kept for replay when it is 2xx or 3xx (4xx too with the "
            "RETAIN_FUNCTION retain_client_errors, except 401, 403, 408, 409 and 429), "
            "never when it streams or is 5xx."
        )
    differences = [
        name
        for name, ours, theirs in (
            ("status", first.status_code, retry.status_code),
            ("Content-Type", first.get("Content-Type"), retry.get("Content-Type")),
            ("body", _content(first), _content(retry)),
        )
        if ours != theirs
    ]
    if differences:
        raise AssertionError(
            f"The replay differs from the first response in {', '.join(differences)}: "
            f"the first got {_describe(first)}, the replay {_describe(retry)}."
        )

    reused = send(other_body)
    reuse_status = idempotency_settings.REUSE_STATUS
    if reused.status_code != reuse_status or _code(reused) != problems.KEY_REUSED:
        hint = (
            " The view's fingerprint does not see the difference: pass other_data= "
            "that differs where it looks."
            if reused.has_header(replayed)
            else ""
        )
        raise AssertionError(
            f"The same key with another body got {_describe(reused)}; expected "
            f"{reuse_status} {problems.KEY_REUSED}.{hint}"
        )
    return first


def _send_with_a_duplicate(
    send: Callable[[bytes], TestResponse], body: bytes, header: str, key: str
) -> tuple[TestResponse, TestResponse | None]:
    """Send the request, and the same request again while the first holds the key.

    The duplicate goes out from a ``reserved`` receiver: on the first request's own
    thread and database connection, so it sees the reservation even while the first
    request's transaction (or the test's) is open, without threads or a slow view.
    The duplicate's response is None when the key was never claimed.
    """
    from idempotency_django import signals

    duplicates: list[TestResponse] = []
    failures: list[Exception] = []
    fired = False

    def send_duplicate(sender: Any, request: HttpRequest, **kwargs: Any) -> None:
        nonlocal fired
        if fired or request.headers.get(header) != key:
            return
        fired = True  # before sending: a duplicate that claimed the key must not recurse
        try:
            duplicates.append(send(body))
        except Exception as exc:  # raised once the first request has finished
            failures.append(exc)

    signals.reserved.connect(send_duplicate, weak=False)
    try:
        first = send(body)
    finally:
        signals.reserved.disconnect(send_duplicate)
    if failures:
        raise failures[0]
    return first, duplicates[0] if duplicates else None


def clear_store(store: BaseStore | None = None) -> None:
    """Delete every reservation and stored response of ``store`` (the configured one).

    The database store's table is emptied; on Redis only the store's own keys
    (``<key_prefix>:v1:*``) are deleted, never the rest of the cache's database.
    A store of the project's own needs a ``clear()`` method.
    """
    from idempotency_django.stores import get_store

    store = store or get_store()
    refusal = f"clear_store() cannot empty a {type(store).__name__}: give it a clear() method."
    clear = getattr(store, "clear", None)
    if clear is None:
        raise TypeError(refusal)
    try:
        clear()
    except NotImplementedError as exc:
        raise TypeError(refusal) from exc


def idempotency_disabled() -> override_settings:
    """``override_settings`` turning the protection off: a decorator or a context manager.

    Keyed requests then run as if they had no key. The other ``IDEMPOTENCY``
    settings stay as they are when it is called.
    """
    from django.conf import settings
    from django.test import override_settings

    return override_settings(IDEMPOTENCY={**getattr(settings, "IDEMPOTENCY", {}), "ENABLED": False})


if _HAVE_PYTEST:

    @pytest.fixture
    def idempotency_store(db: None) -> Iterator[BaseStore]:
        """The configured store, emptied before and after the test.

        A store outside the test's transaction (Redis) keeps its keys from one test
        to the next otherwise. Needs database access, like pytest-django's ``db``
        (and works with ``transactional_db`` and ``django_db(transaction=True)``).
        """
        from idempotency_django.stores import get_store

        store = get_store()
        clear_store(store)
        yield store
        clear_store(store)

    @pytest.fixture
    def no_idempotency(settings: Any) -> None:
        """Turn the protection off for the test: keyed requests run as if they had no key.

        Set through pytest-django's ``settings`` fixture, so other changes a test
        makes with it compose: add to ``settings.IDEMPOTENCY`` rather than
        replacing it.
        """
        settings.IDEMPOTENCY = {**getattr(settings, "IDEMPOTENCY", {}), "ENABLED": False}


def _encode(data: Any, content_type: str) -> tuple[bytes, str]:
    """The body bytes of ``data``, and the content type to send them with.

    Encoded once, so every request of a check sends the same bytes (an open file
    in ``data`` is read once).
    """
    from django.core.serializers.json import DjangoJSONEncoder
    from django.test.client import (
        BOUNDARY,
        JSON_CONTENT_TYPE_RE,
        MULTIPART_CONTENT,
        encode_multipart,
    )

    if isinstance(data, str):
        data = data.encode()
    if data is None or isinstance(data, bytes):
        return data or b"", content_type
    if JSON_CONTENT_TYPE_RE.match(content_type):
        return json.dumps(data, cls=DjangoJSONEncoder).encode(), content_type
    if not isinstance(data, Mapping):
        raise TypeError(
            f"Cannot send {type(data).__name__} as {content_type}: pass a dict, bytes or str."
        )
    if content_type.split(";")[0].strip().lower() == "multipart/form-data":
        return encode_multipart(BOUNDARY, dict(data)), MULTIPART_CONTENT
    return urlencode(data, doseq=True).encode(), content_type


def _another_request(data: Any) -> dict[str, Any]:
    if data is None or isinstance(data, Mapping):
        return {**(data or {}), OTHER_REQUEST_FIELD: "another request"}
    raise TypeError(
        "assert_idempotent() makes the reused-key check's other request by adding a field "
        f"to a dict; with {type(data).__name__} data, pass other_data= too."
    )


def _content(response: HttpResponseBase) -> bytes:
    return b"<streaming>" if response.streaming else bytes(getattr(response, "content", b""))


def _code(response: HttpResponseBase) -> str:
    """The problem ``code`` of an error response, or ""."""
    try:
        problem = json.loads(_content(response))
    except ValueError:
        return ""
    if isinstance(problem, dict) and isinstance(problem.get("errors"), list) and problem["errors"]:
        problem = problem["errors"][0]  # a JSON:API error document
    code = problem.get("code") if isinstance(problem, dict) else None
    return code if isinstance(code, str) else ""


def _describe(response: HttpResponseBase) -> str:
    code = _code(response)
    headers = "; ".join(f"{name}: {value}" for name, value in response.items())
    return (
        f"{response.status_code}{' ' + code if code else ''} "
        f"[{headers}] {_content(response)[:300]!r}"
    )
