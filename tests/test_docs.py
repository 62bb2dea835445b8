"""The documentation site: it builds strictly, and every code block in it is exercised.

* ``python`` blocks are in the page and Sybil runs them from the Markdown
  (tests/docs_blocks.py);
* ``js`` blocks are in the page and are lines of the script the example project serves,
  which tests/test_example_browser.py drives;
* ``console`` blocks with ``curl`` may stay inline: tests/test_example_project.py
  makes the same requests against the example project (this test checks that each
  one targets a route the example serves);
* the problem responses on docs/errors.md are checked against the library's codes;
* the settings page documents every key of ``conf.DEFAULTS``;
* the examples under tests/docs_examples are run below.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import subprocess
import sys
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, RequestFactory, override_settings

from idempotency_django import webhooks
from idempotency_django.conf import DEFAULTS
from idempotency_django.models import WebhookDelivery
from idempotency_django.protocol import problems
from idempotency_django.protocol.fingerprint import default_fingerprint
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import protect
from idempotency_django.stores import RecordKey, RequestInfo, get_store
from idempotency_django.webhooks.identity import TRIGGER_PREFIX, trigger_digest
from tests import docs_blocks
from tests.docs_blocks import run_page_code
from tests.docs_examples.webhooks import WEBHOOK_SECRET, sign
from tests.redis_helpers import DOWN_ALIAS, caches_with
from tests.testapp.models import Booking

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
#: The pages written with the example project; every other page (stores.md,
#: operating.md, generated results) is someone else's, and the build waits for the
#: nav's pages to exist.
MY_PAGES = {
    "index.md",
    "quickstart.md",
    "guarantees.md",
    "settings.md",
    "django.md",
    "drf.md",
    "ninja.md",
    "webhooks.md",
    "errors.md",
    "clients.md",
    "signals.md",
    "upgrading.md",
    "changelog.md",
    "troubleshooting.md",
    "testing.md",
    "cors.md",
    "api.md",
    "contributing.md",
    "architecture.md",
    "writing-a-store.md",
    "production.md",
}
OTHERS_PAGES = {p.name for p in PAGES} - MY_PAGES | {"stores.md", "operating.md"}
INCLUDE_LANGUAGES = {"python", "py", "pycon", "js", "javascript"}
SNIPPET = re.compile(r'^\s*-{1,}8<-{1,}\s+"(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"\s*$')
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
#: A Sphinx cross-reference role as it renders when nothing resolves it (":func:`x`").
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|mod|attr|exc|obj|const):(?:<code>|`)")
#: Routes of the example project that curl examples may call.
EXAMPLE_ROUTES = re.compile(
    r"^/(api/bookings/(\d+/)?|plain/bookings/|hooks/[\w-]+/|standard-hooks/[\w-]+/)$"
)
STANDARD_MEMBERS = {"type", "title", "status", "code", "detail"}
#: Members a problem adds to the standard ones.
EXTENSIONS = {problems.RESPONSE_NOT_STORED: {"original_status"}}
#: Every refusal, from the tables the answers are made from.
REFUSALS = {**webhooks.REFUSALS, **problems.REFUSALS}
PROBLEM_CODES = sorted(REFUSALS)


def code_blocks(page: Path) -> list[tuple[int, str, list[str]]]:
    """(line number, language, lines) of every fenced block on the page."""
    blocks = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        fence, start, body = opened["fence"], index + 1, []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        blocks.append((start, opened["lang"].lower(), body))
        index += 1
    return blocks


def nav_pages() -> list[str]:
    text = (REPO_ROOT / "mkdocs.yml").read_text()
    return re.findall(r":\s*([\w-]+\.md)\s*$", text, flags=re.MULTILINE)


# -- the site -----------------------------------------------------------------


def test_every_nav_page_exists_except_the_ones_being_written() -> None:
    missing = [page for page in nav_pages() if not (DOCS / page).exists()]
    assert set(missing) <= OTHERS_PAGES, missing
    assert set(nav_pages()) >= MY_PAGES | {"stores.md", "operating.md"}, "a page is not in nav"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install mkdocs-material)")
    missing = [page for page in nav_pages() if not (DOCS / page).exists()]
    assert set(missing) <= OTHERS_PAGES, missing
    if missing:
        pytest.skip(f"waiting for {', '.join(missing)} (written by someone else)")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    quickstart = (site / "quickstart" / "index.html").read_text()
    assert "BookingViewSet" in quickstart  # the snippet was included
    assert "--8&lt;--" not in quickstart and "--8<--" not in quickstart
    # Docstrings are Markdown for mkdocstrings: a Sphinx role renders as literal text.
    raw_roles = {
        f"{page.relative_to(site)}: {role}"
        for page in site.rglob("*.html")
        for role in SPHINX_ROLE.findall(page.read_text())
    }
    assert not raw_roles, sorted(raw_roles)


# -- code blocks ----------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_code_is_in_the_page_not_included(page: Path) -> None:
    """A reader of the page on the repository's web view sees the code, not an include
    line; Sybil runs the blocks from the Markdown (tests/docs_blocks.py)."""
    for line_number, lang, body in code_blocks(page):
        if lang not in INCLUDE_LANGUAGES:
            continue
        includes = [line for line in body if SNIPPET.match(line)]
        if f"docs/{page.name}" in docs_blocks.PAGES:
            assert not includes, f"{page.name}:{line_number}: {includes}"
            continue
        for line in includes:
            match = SNIPPET.match(line)
            assert match is not None
            source = REPO_ROOT / match["path"]
            assert source.exists(), f"{page.name}:{line_number}: {match['path']} does not exist"
            if match["section"]:
                text = source.read_text()
                for edge in ("start", "end"):
                    marker = f"--8<-- [{edge}:{match['section']}]"
                    assert marker in text, f"{match['path']} has no {marker}"


def test_sybil_runs_every_python_block_of_its_pages() -> None:
    """Each python fence of a page Sybil runs is a block it understands: a fence it could
    not read (a typo in its info string) would otherwise be skipped in silence."""
    from sybil import Document

    for name in docs_blocks.PAGES:
        text = (REPO_ROOT / name).read_text()
        fences = len(re.findall(r"^\s*```(?:python|py)\b", text, re.M))
        regions = list(docs_blocks.PythonBlocks().fences(Document(text, name)))
        assert len(regions) == fences, name
        for region in regions:
            assert docs_blocks.TITLE.match(region.lexemes["info"]), (name, region.lexemes["info"])


def test_js_blocks_are_the_example_page_script() -> None:
    """A browser runs the example's booking.js, not the Markdown: each js block of a page
    is lines of it (indentation aside), so the page shows what the browser tests run."""
    script = (REPO_ROOT / "example_project/bookings/templates/bookings/booking.js").read_text()
    served = "\n".join(line.strip() for line in script.splitlines())
    shown = [
        (page.name, body) for page in PAGES for _, lang, body in code_blocks(page) if lang == "js"
    ]
    assert shown, "no js blocks found"
    for name, body in shown:
        assert "\n".join(line.strip() for line in body) in served, name


def test_webhook_blocks_are_the_example_receivers() -> None:
    """docs/webhooks.md's receivers need the example's WebhookRun (Sybil skips them) and
    its verifier runs in Sybil: every line of those blocks is a line of the example's
    module, which tests/test_example_project.py serves and sends deliveries to."""
    module = (REPO_ROOT / "example_project/bookings/webhooks.py").read_text()
    lines = {line.rstrip() for line in module.splitlines()}
    shown = [body for _, lang, body in code_blocks(DOCS / "webhooks.md") if lang == "python"]
    receivers = [
        body for body in shown if any("def " in line and "receiver" in line for line in body)
    ]
    assert len(receivers) == 2, "the generic and the Standard Webhooks receivers"
    verifier = [
        body for body in shown if any("def verify_standard_webhook" in line for line in body)
    ]
    for body in [*receivers, *verifier]:
        assert {line.rstrip() for line in body} - lines == set()


CURL_PAGES = [*PAGES, REPO_ROOT / "example_project" / "README.md"]


@pytest.mark.parametrize("page", CURL_PAGES, ids=[p.name for p in CURL_PAGES])
def test_curl_examples_call_the_example_project(page: Path) -> None:
    for line_number, lang, body in code_blocks(page):
        if lang not in {"console", "shell", "bash", "sh"}:
            continue
        # Requests, not pip's git+https:// install URLs.
        for url in re.findall(r"(?<!git\+)https?://[^\s'\"\\]+", "\n".join(body)):
            path = re.sub(r"^https?://[^/]+", "", url)
            if page.name in OTHERS_PAGES:
                continue
            assert url.startswith("http://127.0.0.1:8000/"), f"{page.name}:{line_number}: {url}"
            assert EXAMPLE_ROUTES.match(path), f"{page.name}:{line_number}: {path}"


def test_curl_examples_are_the_requests_the_example_tests_make() -> None:
    """Each key and delivery id a curl example sends is one tests/test_example_project.py uses."""
    tested = (REPO_ROOT / "tests" / "test_example_project.py").read_text()
    pages = [DOCS / name for name in sorted(MY_PAGES)] + [REPO_ROOT / "example_project/README.md"]
    sent = set()
    for page in pages:
        for _, lang, body in code_blocks(page):
            if lang in {"console", "shell", "bash", "sh"}:
                text = "\n".join(body)
                sent |= set(re.findall(r'-H "(?:Idempotency-Key|webhook-id): ([^"]+)"', text))
                for payload in re.findall(r"-d '([^']+)'", text):
                    json.loads(payload)  # a valid JSON body
    assert sent, "no curl examples found"
    assert {value for value in sent if f'"{value}"' not in tested} == set()


def test_ruff_format_leaves_the_snippet_includes_alone() -> None:
    """ruff >= 0.16 formats python blocks in Markdown and would turn ``--8<-- "..."`` into
    ``--8 < --"..."``; pages with includes turn it off with ``<!-- fmt: off -->``."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed")
    pages = [str(DOCS / name) for name in sorted(MY_PAGES)]
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *pages],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_settings_page_documents_every_setting() -> None:
    text = (DOCS / "settings.md").read_text()
    headings = set(re.findall(r"^#{2,4}\s+`([A-Z_]+)`\s*$", text, flags=re.MULTILINE))
    assert set(DEFAULTS) - headings == set(), "settings missing from docs/settings.md"
    assert headings - set(DEFAULTS) == set(), "docs/settings.md documents unknown settings"


def test_errors_page_documents_every_problem_code() -> None:
    text = (DOCS / "errors.md").read_text()
    headings = set(re.findall(r"^#{2,4}\s+`([a-z_]+)`", text, flags=re.MULTILINE))
    assert set(PROBLEM_CODES) - headings == set(), "codes missing from docs/errors.md"
    assert headings - set(PROBLEM_CODES) == set(), "docs/errors.md has unknown codes"
    examples = [body for _, lang, body in code_blocks(DOCS / "errors.md") if lang == "http"]
    shown = set()
    for body in examples:
        status_line, *rest = body
        match = re.match(r"HTTP/1\.1 (\d{3}) (.+)$", status_line)
        assert match, status_line
        status = int(match[1])
        assert match[2] in {HTTPStatus(status).phrase, problems.TITLES.get(status)}
        blank = rest.index("")
        headers = dict(line.split(": ", 1) for line in rest[:blank])
        problem = json.loads("\n".join(rest[blank + 1 :]))
        shown.add(problem["code"])
        assert problem["code"] in PROBLEM_CODES
        assert headers["Content-Type"] == problems.PROBLEM_CONTENT_TYPE
        standard = {name: problem[name] for name in problem if name in STANDARD_MEMBERS}
        refusal = REFUSALS[problem["code"]]
        assert status == refusal.status_code()
        assert {**standard, "detail": ""} == problems.problem_members(status, refusal.code, "")
        assert set(problem) - STANDARD_MEMBERS == EXTENSIONS.get(problem["code"], set())
        assert problem["detail"]
        assert ("Retry-After" in headers) == refusal.retry_after, problem["code"]
    assert shown == set(PROBLEM_CODES), "every code needs an example response"


def test_troubleshooting_covers_every_problem_code() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    rows = set(re.findall(r"^\| \[`([a-z_]+)`\]\(errors\.md#\1\)", text, flags=re.MULTILINE))
    assert rows == set(PROBLEM_CODES)


# -- the view examples ------------------------------------------------------------

docs_urls = override_settings(ROOT_URLCONF="tests.docs_examples.urls")


def post(client: Client, url: str, payload: Any = None, key: str | None = None, **extra: Any):  # type: ignore[no-untyped-def]
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    body = json.dumps(payload if payload is not None else {})
    return client.post(url, body, content_type="application/json", **extra)


@docs_urls
def test_django_view_examples(alice_client: Client, alice: User) -> None:
    first = post(alice_client, "/plain/bookings/", {"slot": "a"}, key="k1")
    again = post(alice_client, "/plain/bookings/", {"slot": "a"}, key="k1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotency-Replayed"] == "true"

    assert post(alice_client, "/invoices/7/pay/").json()["code"] == problems.KEY_MISSING
    paid = post(alice_client, "/invoices/7/pay/", key="pay-7")
    assert post(alice_client, "/invoices/7/pay/", key="pay-7").content == paid.content
    assert Booking.objects.filter(slot="invoice-7").count() == 1

    post(alice_client, "/vouchers/redeem/", key="v1")
    assert post(alice_client, "/vouchers/redeem/", key="v1")["Idempotency-Replayed"] == "true"

    booking = Booking.objects.create(slot="b", owner=alice)
    url = f"/bookings/{booking.pk}/cancel/"
    assert post(alice_client, url, key="c1").json() == {"cancelled": booking.pk}
    assert post(alice_client, url, key="c1")["Idempotency-Replayed"] == "true"

    post(alice_client, "/clicks/", key="same")
    post(alice_client, "/clicks/", key="same")
    assert Booking.objects.filter(slot="click").count() == 2

    slot = {"slot": "9:00", "customer": "Dana"}
    post(alice_client, "/slots/", {**slot, "sent_at": 1}, key="s1")
    retry = post(alice_client, "/slots/", {**slot, "sent_at": 2}, key="s1")
    assert retry["Idempotency-Replayed"] == "true"
    assert Booking.objects.filter(slot="9:00").count() == 1


@docs_urls
def test_drf_view_examples(alice_client: Client) -> None:
    made = post(alice_client, "/api/bookings/", {"slot": "s"}, key="d1")
    assert made.status_code == 201
    assert post(alice_client, "/api/bookings/", {"slot": "s"}, key="d1").content == made.content
    pk = made.json()["id"]
    assert post(alice_client, f"/api/bookings/{pk}/confirm/", key="d2").status_code == 200
    assert post(alice_client, f"/api/bookings/{pk}/confirm/", key="d2")["Idempotency-Replayed"]
    assert Booking.objects.filter(slot=f"confirmation-{pk}").count() == 1
    assert post(alice_client, f"/api/bookings/{pk}/charge/").status_code == 400
    assert post(alice_client, f"/api/bookings/{pk}/charge/", key="d3").status_code == 201
    assert "Idempotency-Replayed" not in post(alice_client, "/api/bookings/search/", key="d4")
    assert "Idempotency-Replayed" not in post(alice_client, "/api/bookings/search/", key="d4")

    booked = post(alice_client, "/api/book/", {"slot": "t"}, key="d5")
    assert booked.status_code == 201
    assert post(alice_client, "/api/book/", {"slot": "t"}, key="d5")["Idempotency-Replayed"]
    assert post(alice_client, "/api/book/", {"slot": "u"}, key="d5").status_code == 409

    missing = post(alice_client, "/api/strict-bookings/", {"slot": "v"})
    assert missing.json()["code"] == problems.KEY_MISSING
    assert post(alice_client, "/api/strict-bookings/", {"slot": "v"}, key="d6").status_code == 201


def signed_headers(msg_id: str, body: bytes, secret: str = WEBHOOK_SECRET) -> dict[str, Any]:
    now = int(time.time())
    return {
        "HTTP_WEBHOOK_ID": msg_id,
        "HTTP_WEBHOOK_TIMESTAMP": str(now),
        "HTTP_WEBHOOK_SIGNATURE": sign(secret, msg_id, now, body),
    }


@pytest.mark.django_db
@docs_urls
def test_standard_webhooks_example_verifies_then_deduplicates(client: Client) -> None:
    url = "/hooks/standard/trg_1/"
    body = b'{"type": "invoice.paid"}'

    def deliver(headers: dict[str, Any]):  # type: ignore[no-untyped-def]
        return client.post(url, body, content_type="application/json", **headers)

    forged_secret = "whsec_" + base64.b64encode(b"not the secret").decode()
    forged = deliver(signed_headers("msg_1", body, forged_secret))
    assert forged.status_code == 401
    assert not WebhookDelivery.objects.exists()  # a forgery claims nothing
    assert deliver({"HTTP_WEBHOOK_ID": "msg_1"}).status_code == 401

    first = deliver(signed_headers("msg_1", body))
    assert first.status_code == 202 and first.json()["status"] == "accepted"
    duplicate = deliver(signed_headers("msg_1", body))
    assert duplicate.status_code == 202 and duplicate.json() == {"status": "duplicate"}
    assert Booking.objects.filter(slot="standard-webhook-run").count() == 1

    # functools.wraps keeps the middleware away, even from a keyed, anonymous delivery.
    with override_settings(IDEMPOTENCY={"ANONYMOUS": "reject"}):
        keyed = deliver({**signed_headers("msg_2", body), "HTTP_IDEMPOTENCY_KEY": "evt-2"})
    assert keyed.status_code == 202 and keyed.json()["status"] == "accepted"


@docs_urls
def test_metrics_example_counts_decisions(alice_client: Client, alice: User) -> None:
    # The page's receivers live as long as this namespace (signals hold them weakly).
    metrics = run_page_code("docs/signals.md", {}, 0)
    post(alice_client, "/plain/bookings/", {"slot": "m"}, key="m1")
    post(alice_client, "/plain/bookings/", {"slot": "m"}, key="m1")
    post(alice_client, "/plain/bookings/", {"slot": "other"}, key="m1")
    # A reservation held by a request that is still running:
    running = RequestFactory().post(
        "/plain/bookings/", json.dumps({"slot": "m"}), content_type="application/json"
    )
    info = RequestInfo("POST", "/plain/bookings/", default_fingerprint(running), "")
    get_store().claim(RecordKey(f"auth.user:{alice.pk}", "", "m2"), info, 300)
    post(alice_client, "/plain/bookings/", {"slot": "m"}, key="m2")
    assert dict(metrics["DECISIONS"]) == {
        "reserved": 1,
        "stored:201": 1,
        "replayed:201": 1,
        f"conflict:{problems.KEY_REUSED}": 1,
        f"conflict:{problems.KEY_IN_PROGRESS}": 1,
    }


def documented_problems() -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    found = {}
    for _, lang, body in code_blocks(DOCS / "errors.md"):
        if lang == "http":
            blank = body.index("")
            headers = dict(line.split(": ", 1) for line in body[1:blank])
            problem = json.loads("\n".join(body[blank + 1 :]))
            found[problem["code"]] = (problem, headers)
    return found


@docs_urls
def test_errors_page_shows_what_the_library_answers(
    alice_client: Client, alice: User, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example on docs/errors.md is the response the library really sends."""
    actual = {
        problems.KEY_INVALID: post(alice_client, "/plain/bookings/", key="a,b"),
        problems.KEY_MISSING: post(alice_client, "/invoices/7/pay/"),
        problems.LOCATION_INVALID: post(
            alice_client, "/plain/bookings/", key="k", HTTP_X_LOCATION_ID="x" * 300
        ),
    }
    post(alice_client, "/plain/bookings/", {"slot": "a"}, key="reused")
    actual[problems.KEY_REUSED] = post(
        alice_client, "/plain/bookings/", {"slot": "b"}, key="reused"
    )

    running = RequestFactory().post(
        "/plain/bookings/", json.dumps({"slot": "c"}), content_type="application/json"
    )
    info = RequestInfo("POST", "/plain/bookings/", default_fingerprint(running), "")
    get_store().claim(RecordKey(f"auth.user:{alice.pk}", "", "busy"), info, 300)
    actual[problems.KEY_IN_PROGRESS] = post(alice_client, "/plain/bookings/", {"slot": "c"}, "busy")

    route, token = "hooks/standard/<str:token>/", "trg_busy"
    delivery = RecordKey(TRIGGER_PREFIX + trigger_digest(route, token), "", "m")
    get_store().claim(delivery, RequestInfo("POST", route, "", "", kind="webhook"), 300)
    body = b"{}"
    actual[webhooks.IN_PROGRESS] = client.post(
        f"/hooks/standard/{token}/",
        body,
        content_type="application/json",
        **signed_headers("m", body),
    )

    with override_settings(IDEMPOTENCY={"ANONYMOUS": "reject"}):
        actual[problems.AUTHENTICATION_REQUIRED] = post(client, "/plain/bookings/", key="anon")

    consumed = RequestFactory().post(
        "/plain/bookings/", "x", content_type="text/plain", HTTP_IDEMPOTENCY_KEY="consumed"
    )
    consumed.user = alice
    consumed.read()
    actual[problems.BODY_UNAVAILABLE] = protect(
        consumed, lambda: pytest.fail("the view ran"), ViewOptions()
    )

    with override_settings(IDEMPOTENCY={"MAX_STORED_BODY": 10}):
        post(alice_client, "/plain/bookings/", {"slot": "big"}, key="big")
        actual[problems.RESPONSE_NOT_STORED] = post(
            alice_client, "/plain/bookings/", {"slot": "big"}, key="big"
        )
    with override_settings(IDEMPOTENCY={"MAX_KEYS_PER_PRINCIPAL": 2}):
        get_store().claim(
            RecordKey(f"auth.user:{alice.pk}", "", "more"), RequestInfo("POST", "/x", "f"), 300
        )
        actual[problems.TOO_MANY_KEYS] = post(
            alice_client, "/plain/bookings/", {"slot": "e"}, "new"
        )

    with override_settings(ROOT_URLCONF="tests.urls"):  # a receiver without a verifier
        actual[webhooks.ID_MISSING] = client.post(
            "/hooks/trg_1/", body, content_type="application/json"
        )
    cut = json.dumps({"slot": "2026-08-05T09:00:00Z", "customer": "Dana Whitfield"}).encode()
    dropped: dict[str, Any] = {"wsgi.input": io.BytesIO(cut[:20])}  # after 20 bytes
    actual[problems.BODY_INCOMPLETE] = alice_client.post(
        "/plain/bookings/",
        cut,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="cut",
        **dropped,
    )
    with override_settings(IDEMPOTENCY={"MAX_FINGERPRINTED_BODY": 10485760}):
        actual[problems.BODY_TOO_LARGE] = alice_client.post(
            "/plain/bookings/",
            b"{}",
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="huge",
            CONTENT_LENGTH="10485761",
        )

    # A Redis store pointed at a port nobody listens on: a real outage.
    down = {"STORE": "redis", "STORE_OPTIONS": {"cache": DOWN_ALIAS}}
    with override_settings(IDEMPOTENCY=down, CACHES=caches_with()):
        actual[problems.UNAVAILABLE] = post(alice_client, "/plain/bookings/", {"slot": "d"}, "down")

    documented = documented_problems()
    assert set(actual) == set(PROBLEM_CODES) == set(documented)
    for code, response in actual.items():
        problem, headers = documented[code]
        assert json.loads(response.content) == problem, code
        assert response.status_code == problem["status"]
        assert response["Content-Type"] == headers["Content-Type"]
        if code == problems.TOO_MANY_KEYS:
            # Seconds until the principal's first key expires: the docs show one value.
            assert int(response["Retry-After"]) > 0
        else:
            assert response.get("Retry-After") == headers.get("Retry-After"), code


# -- one story for the middleware's place ----------------------------------------

#: How pages described the middleware before it stopped calling the view: last, after
#: CsrfViewMiddleware. The truth (middleware.py, checks.py): anywhere after
#: AuthenticationMiddleware, which is the one order system check E001 reports.
STALE_PLACEMENT = re.compile(
    r"middleware\W+(?:\*\*)?last\b|\blast in `MIDDLEWARE`|calls the view itself"
    r"|after `CsrfViewMiddleware`|\[last\]\(guarantees",
    re.I,
)


@pytest.mark.parametrize(
    "page", [*PAGES, REPO_ROOT / "README.md"], ids=[*(p.name for p in PAGES), "README.md"]
)
def test_every_page_tells_one_story_of_the_middleware_place(page: Path) -> None:
    text = " ".join(page.read_text().split())
    assert not STALE_PLACEMENT.findall(text), page.name


def test_the_readme_says_what_plain_pytest_uses() -> None:
    """Every program the suite looks for on this machine (shutil.which, Chromium), every
    local server it reaches, and how long the run takes are in the README's Development."""
    readme = (REPO_ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1].split("\n## ", 1)[0]
    sources = "\n".join(path.read_text() for path in (REPO_ROOT / "tests").rglob("*.py"))
    programs = set(re.findall(r'shutil\.which\("([\w-]+)"\)', sources)) - {"redis-cli"}
    assert {"curl", "redis-server"} <= programs
    for needed in [*programs, "/usr/bin/chromium", "127.0.0.1:5432", "127.0.0.1:6379"]:
        assert needed in development, needed
    # Roughly how long, not a count that goes stale (issue 38, item 4).
    assert re.search(r"`pytest` takes a couple of minutes", development)


def test_security_md_says_how_to_report_what_is_supported_and_in_scope() -> None:
    text = (REPO_ROOT / "SECURITY.md").read_text()
    for heading in ("## Reporting a vulnerability", "## Supported versions", "## In scope"):
        assert heading in text
    assert "security/advisories/new" in text
    assert "Python 3.11 or newer, Django 5.2 LTS" in text


def test_conf_comments_name_no_internal_seed_projects() -> None:
    """conf.py's comments say what a default means, not which internal project had it."""
    text = (REPO_ROOT / "idempotency_django" / "conf.py").read_text()
    for name in ("HyphaBase", "Hodoflow", "the seeds"):
        assert name.lower() not in text.lower(), name


def test_guarantees_md_describes_every_anonymous_mode() -> None:
    """Each value of ANONYMOUS (checks.py accepts these three) is in guarantees.md's section."""
    text = (REPO_ROOT / "docs" / "guarantees.md").read_text()
    section = text.split("### Anonymous requests", 1)[1].split("\n## ", 1)[0]
    for mode in ('"ignore"', '"reject"', '"session"'):
        assert mode in section, mode
    assert "SessionMiddleware" in section
    assert "idempotency_django.E014" in section
    assert "digest of the session key" in section


def collected(*args: str) -> str:
    """The last line of ``pytest --collect-only -q`` with ``args``, run from the checkout."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode in (0, 5), listed.stdout + listed.stderr  # 5: none selected
    return listed.stdout.strip().splitlines()[-1]


def test_plain_pytest_leaves_out_the_real_service_tests_and_ci_runs_them() -> None:
    """pytest: the embedded default; pytest -m services: servers, browser, example
    project, scale-out, hang-ups; pytest --all (CI on every database): both."""
    real = ["tests/hangup", "tests/test_scale_out.py", "tests/test_admin_browser.py"]
    assert re.fullmatch(r"\d+ tests collected in .*", collected("-m", "services", *real))
    assert re.fullmatch(r"no tests collected \(\d+ deselected\).*", collected(*real))
    assert re.fullmatch(r"\d+ tests collected in .*", collected("--all", *real))
    # Each command on one line, whatever variables of its own it is given before it.
    ci = (REPO_ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    commands = re.findall(r'\n((?:[A-Z_]+=\S+\s+)*)pytest --all "\$\{coverage_args\[@\]\}"', ci)
    variables = [dict(pair.split("=", 1) for pair in env.split()) for env in commands]
    databases = sorted(env.get("TEST_DATABASE", "sqlite") for env in variables)
    assert databases == ["mariadb", "postgres", "sqlite"]
    readme = (REPO_ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1].split("\n## ", 1)[0]
    for command in ("pytest -m services", "pytest --all"):
        assert command in development, command
    assert re.search(r"`pytest -m services` five or so", development)


def test_one_install_story() -> None:
    """The package is installed one way, shown in one place (docs/quickstart.md#install,
    and README.md's quickstart): other pages name the extra and link there; the extras
    list there names every extra a user installs (issue 38, item 3)."""
    import tomllib

    for page in [*PAGES, REPO_ROOT / "README.md"]:
        if page.name in {"quickstart.md", "README.md", "changelog.md"}:
            continue
        text = page.read_text()
        # From an index (nothing after the extras): the package is not on one.
        index = re.search(r"pip install ['\"]?idempotency-(django|client)\[[^\]]*\](?!\s*@)", text)
        assert not index, (page.name, index)
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    install = (DOCS / "quickstart.md").read_text().split("## Start a project")[0]
    users = set(extras) - {"dev", "mariadb", "example", "docs"}
    assert {extra for extra in users if f"`{extra}`" not in install} == set()


def test_the_readme_states_no_test_counts() -> None:
    """Counts go stale with every test added (issue 38, item 4): the README says what each
    command runs and roughly how long it takes."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert not re.findall(r"\b\d[\d,]* (?:passed|skipped|tests)\b", readme)
    assert "manage.py demo 8001" in readme  # how to pick the demo's port


def test_the_production_checklist_names_only_what_exists() -> None:
    """Every setting, check, signal and command docs/production.md names exists (issue 38,
    item 5); the page is linked from the README."""
    from django.conf import global_settings

    from idempotency_django import signals
    from idempotency_django.stores.database import DatabaseStore

    text = (DOCS / "production.md").read_text()
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", text))
    django_settings = {name for name in dir(global_settings) if name.isupper()}
    database_keys = {"CONN_MAX_AGE", "ATOMIC_REQUESTS"}
    levels = {"INFO", "WARNING"}
    keys_of_settings = {"INTERVAL", "MAX_RUN_TIME", *DEFAULTS["MARKER_HEADERS"]}
    unknown = named - set(DEFAULTS) - keys_of_settings - django_settings - database_keys - levels
    assert unknown == set()
    assert {"LOCK_TIMEOUT", "HEARTBEAT", "MAX_KEYS_PER_PRINCIPAL", "ENCRYPTION_KEY"} <= named
    checks_named = set(re.findall(r"check `(E\d{3})`", text))
    source = (REPO_ROOT / "idempotency_django").rglob("*.py")
    ids = set(re.findall(r"[.\"](E\d{3})\"", "".join(p.read_text() for p in source)))
    assert checks_named and checks_named <= ids
    for signal in ("unavailable", "conflict", "released", "replayed", "reserved"):
        assert f"`{signal}`" in text and hasattr(signals, signal)
    assert "async_claim_commit" in DatabaseStore.__init__.__code__.co_varnames
    assert (
        REPO_ROOT / "idempotency_django/management/commands/purge_idempotency_records.py"
    ).exists()
    assert "purge_idempotency_records" in text
    assert "(docs/production.md)" in (REPO_ROOT / "README.md").read_text()
