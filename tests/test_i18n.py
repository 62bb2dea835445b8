"""Problem details are translated with Django's i18n; the package ships a French catalog."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, modify_settings
from django.utils import translation

import idempotency_django

pytestmark = pytest.mark.django_db

BODY = json.dumps({"slot": "2026-07-30T09:00:00Z"})
LOCALE = Path(idempotency_django.__file__).parent / "locale"
LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"


@pytest.fixture(autouse=True)
def restore_the_language() -> Iterator[None]:
    """LocaleMiddleware leaves the language it activated on the thread: later tests expect
    English."""
    with translation.override(translation.get_language()):
        yield


def post(client: Client, body: str = BODY, **extra: Any):  # type: ignore[no-untyped-def]
    return client.post(
        "/plain/bookings/",
        body,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="fr-1",
        **extra,
    )


def test_an_active_language_translates_the_detail_but_not_the_code(alice_client: Client) -> None:
    post(alice_client)
    with translation.override("fr"):
        reused = post(alice_client, body="{}").json()
    assert reused["code"] == "idempotency_key_reused"
    assert reused["detail"] == (
        "Cette clé d'idempotence a déjà servi pour une autre requête. "
        "Utilisez une nouvelle clé pour une nouvelle opération."
    )
    english = post(alice_client, body="{}").json()
    assert english["detail"].startswith("This idempotency key was already used")


@modify_settings(MIDDLEWARE={"prepend": LOCALE_MIDDLEWARE})
def test_accept_language_picks_the_detail_language(alice_client: Client) -> None:
    post(alice_client, HTTP_ACCEPT_LANGUAGE="fr")
    reused = post(alice_client, body="{}", HTTP_ACCEPT_LANGUAGE="fr").json()
    assert reused["detail"].startswith("Cette clé d'idempotence a déjà servi")


def test_the_french_catalog_is_compiled_and_translates_every_entry() -> None:
    po = (LOCALE / "fr" / "LC_MESSAGES" / "django.po").read_text()
    assert (LOCALE / "fr" / "LC_MESSAGES" / "django.mo").exists()
    ids = [
        "".join(re.findall(r'"(.*)"', block))
        for block in re.findall(r'^msgid ((?:".*"\n)+)', po, re.MULTILINE)
    ]
    ids = [i for i in ids if i]
    assert len(ids) == 22
    with translation.override("fr"):
        for msgid in ids:
            assert translation.gettext(msgid) != msgid, msgid
    sources = "".join(
        (Path(idempotency_django.__file__).parent / name).read_text()
        for name in ("protocol/problems.py", "webhooks/__init__.py")
    )
    flat = re.sub(r'"\s*\n\s*"', "", sources)  # implicit concatenation of adjacent literals
    keys = (Path(idempotency_django.__file__).parent / "protocol" / "keys.py").read_text()
    flat += re.sub(r'"\s*\n\s*"', "", keys)
    for msgid in ids:
        # Marked by _() or gettext_noop(), its literal on the call's line or the next.
        assert re.search(r'(?:\b_|gettext_noop)\(\s*"' + re.escape(msgid) + '"', flat), msgid


@modify_settings(MIDDLEWARE={"prepend": LOCALE_MIDDLEWARE})
def test_a_malformed_key_is_refused_in_the_clients_language(alice_client: Client) -> None:
    too_long = alice_client.post(
        "/plain/bookings/", BODY, content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k" * 300, HTTP_ACCEPT_LANGUAGE="fr",
    ).json()  # fmt: skip
    assert too_long["code"] == "idempotency_key_invalid"
    assert too_long["detail"] == "La clé Idempotency-Key dépasse 255 caractères."
    english = alice_client.post(
        "/plain/bookings/", BODY, content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="a,b",
    ).json()  # fmt: skip
    assert english["detail"] == "Send exactly one Idempotency-Key header; commas are not allowed."
