"""Clients that behave like a browser: CSRF enforced, logged in through the login page."""

from __future__ import annotations

import re

from django.test import Client

LOGIN_URL = "/accounts/login/"
#: Browsers send the page's origin with every form post; Django checks it.
ORIGIN = "http://testserver"
_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def csrf_token_of(client: Client, page: str) -> str:
    """GET ``page`` and read the CSRF token from its form, as a browser submits it."""
    response = client.get(page)
    assert response.status_code == 200, response.status_code
    match = _TOKEN.search(response.content.decode())
    assert match is not None, "the page has no CSRF token in its form"
    return match.group(1)


def browser(username: str, password: str) -> Client:
    """A client that enforces CSRF, logged in by posting the login form."""
    client = Client(enforce_csrf_checks=True, HTTP_ORIGIN=ORIGIN)
    token = csrf_token_of(client, LOGIN_URL)
    response = client.post(
        LOGIN_URL, {"username": username, "password": password, "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302, f"login failed: {response.status_code}"
    return client
