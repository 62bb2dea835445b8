"""Real servers for the test project, and an HTTP client that logs in and hangs up."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie

from tests.servers import running, uvicorn

#: The command line of each server, for a port; ASGI servers serve ``asgi``, gunicorn ``wsgi``.
COMMANDS = {
    "uvicorn": lambda port: uvicorn("tests.hangup.app:asgi", port),
    "daphne": lambda port: ["daphne", "-b", "127.0.0.1", "-p", str(port), "tests.hangup.app:asgi"],
    "gunicorn": lambda port: [
        "gunicorn",
        "tests.hangup.app:wsgi",
        "--bind",
        f"127.0.0.1:{port}",
        "--worker-class",
        "gthread",
        "--workers",
        "1",
        "--threads",
        "8",
        "--log-level",
        "warning",
    ],
}
ASGI_SERVERS = ("uvicorn", "daphne")
_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@contextlib.contextmanager
def serve(kind: str, **environment: str) -> Iterator[int]:
    """Run ``kind`` on the test database, with ``environment`` (``HANGUP_*``); yield its port."""
    settings = {"DJANGO_SETTINGS_MODULE": "tests.hangup.settings", **environment}
    with running(COMMANDS[kind], settings, what=kind, ready_path="/accounts/login/") as port:
        yield port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotency-replayed") == "true"

    def json(self) -> dict[str, object]:
        return json.loads(self.body)  # type: ignore[no-any-return]


@dataclass
class Browser:
    """A client with a cookie jar that logs in through the login page, CSRF enforced."""

    port: int
    cookies: dict[str, str] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers=self._headers(headers))
            response = conn.getresponse()
            answer = Answer(
                response.status,
                {name.lower(): value for name, value in response.getheaders()},
                response.read(),
            )
        finally:
            conn.close()
        for value in response.headers.get_all("Set-Cookie") or []:
            cookie = SimpleCookie(value)
            self.cookies.update({name: morsel.value for name, morsel in cookie.items()})
        return answer

    def login(self, username: str, password: str) -> Browser:
        page = self.request("GET", "/accounts/login/")
        match = _TOKEN.search(page.body.decode())
        assert match is not None, page.body
        form = f"username={username}&password={password}&csrfmiddlewaretoken={match.group(1)}"
        answer = self.request(
            "POST", "/accounts/login/", form.encode(),
            **{"Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        assert answer.status == 302, (answer.status, answer.body[:500])
        assert "sessionid" in self.cookies
        return self

    def post(self, path: str, key: str, payload: object = None, **headers: str) -> Answer:
        return self.request("POST", path, self._body(payload), **self._keyed(key, headers))

    def hang_up(
        self, path: str, key: str, payload: object = None, after: float = 0.3, **headers: str
    ) -> None:
        """Send a whole keyed POST, then close the socket ``after`` seconds without reading."""
        body = self._body(payload)
        all_headers = {
            "Host": f"127.0.0.1:{self.port}",
            "Content-Length": str(len(body)),
            **self._headers(self._keyed(key, headers)),
        }
        head = f"POST {path} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in all_headers.items()
        )
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(head.encode() + b"\r\n" + body)
            time.sleep(after)
            sock.shutdown(socket.SHUT_RDWR)

    def _body(self, payload: object) -> bytes:
        return json.dumps({"slot": "2026-07-30T09:00"} if payload is None else payload).encode()

    def _keyed(self, key: str, headers: dict[str, str]) -> dict[str, str]:
        return {"Content-Type": "application/json", "Idempotency-Key": key, **headers}

    def _headers(self, headers: dict[str, str]) -> dict[str, str]:
        extra = {"Origin": self.origin}
        if self.cookies:
            extra["Cookie"] = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        if "csrftoken" in self.cookies:
            extra["X-CSRFToken"] = self.cookies["csrftoken"]
        return {**extra, **headers}
