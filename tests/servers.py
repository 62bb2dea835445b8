"""Real servers of the test project: starting one, waiting for it, stopping it.

``running()`` runs one on the test database; the tests that start servers of their
own (scale-out, the example project, quickstart) wait through ``wait_until()``.

A server that is still booting can refuse the connection, accept it and say nothing
(a gunicorn master whose workers are importing Django: the read times out), close it,
or answer half a status line. Every one of those means "not yet", never a failure;
only the process exiting, or no answer by a deadline, fails the test.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

#: Long, because it only bounds a server that never comes up: a healthy one is
#: used as soon as it answers. A busy 2-core laptop has taken over 30 s to boot
#: two gunicorns of three workers each.
START_SECONDS = 180.0

#: A well-formed CSRF secret, sent as cookie and header by logged_in_headers().
CSRF_SECRET = "a" * 16 + "B" * 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(url: str, headers: Mapping[str, str] | None = None, timeout: float = 5) -> int | None:
    """The HTTP status ``url`` answers with, or None while nothing answers it."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)
    # OSError: refused, reset, URLError, and TimeoutError (socket.timeout) while workers
    # boot; HTTPException: a malformed status line (BadStatusLine).
    except (OSError, http.client.HTTPException):
        return None


def wait_until(
    ready: Callable[[], bool],
    process: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    *,
    what: str = "the server",
    seconds: float = START_SECONDS,
    log: Path | None = None,
) -> None:
    """Poll ``ready`` until it is true; fail at once if ``process`` exits meanwhile."""
    deadline = time.monotonic() + seconds
    while not ready():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {seconds:.0f} s{_tail(log)}")
        time.sleep(0.2)


def uvicorn(app: str, port: int) -> list[str]:
    """The module and arguments (for ``python -m``) of uvicorn serving the ASGI ``app``."""
    return ["uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


@contextlib.contextmanager
def running(
    command: Callable[[int], list[str]],
    environment: Mapping[str, str],
    *,
    what: str,
    ready_path: str = "/",
) -> Iterator[int]:
    """Run ``python -m`` with ``command(port)`` on a free port, on the test database,
    with ``environment`` (its DJANGO_SETTINGS_MODULE at least); yield the port once
    ``ready_path`` answers, and stop the server after."""
    port = free_port()
    env = {**os.environ, "TESTS_DB_NAME": str(connection.settings_dict["NAME"]), **environment}
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "server.log"
        with log.open("wb") as output:
            server = subprocess.Popen(
                [sys.executable, "-m", *command(port)],
                cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            ready = f"http://127.0.0.1:{port}{ready_path}"
            wait_until(lambda: status(ready) is not None, server, what=what, log=log)
            yield port
        finally:
            stop(server)


@contextlib.contextmanager
def test_project_on_uvicorn(settings: str = "tests.settings", **environment: str) -> Iterator[str]:
    """The test project (``tests.asgi``) with the ``settings`` module, served by a real
    uvicorn with ``environment`` added; yields its base URL."""
    import pytest

    pytest.importorskip("uvicorn")
    with running(
        lambda port: uvicorn("tests.asgi:application", port),
        {"DJANGO_SETTINGS_MODULE": settings, **environment},
        what="uvicorn",
    ) as port:
        yield f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Ask ``process`` to exit; kill it if it has not within 15 s."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def logged_in_headers(user: AbstractBaseUser) -> dict[str, str]:
    """Headers that make a request to a real server ``user``'s: the cookie of a session
    made in the test database, and a CSRF cookie with its header."""
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    return {
        "Cookie": f"sessionid={session.session_key}; csrftoken={CSRF_SECRET}",
        "X-CSRFToken": CSRF_SECRET,
    }


def post(
    url: str, body: bytes, headers: Mapping[str, str], timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` to a real server: the status, headers and body of its answer, an
    error status's included."""
    request = urllib.request.Request(url, data=body, method="POST", headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + log.read_text(errors="replace")[-4000:]
