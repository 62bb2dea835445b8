"""Waiting for a server a test started: one helper for every test that starts one.

A server that is still booting can refuse the connection, accept it and say nothing
(a gunicorn master whose workers are importing Django: the read times out), close it,
or answer half a status line. Every one of those means "not yet", never a failure;
only the process exiting, or no answer by a deadline, fails the test.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

#: Long, because it only bounds a server that never comes up: a healthy one is
#: used as soon as it answers. A busy 2-core laptop has taken over 30 s to boot
#: two gunicorns of three workers each.
START_SECONDS = 180.0


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


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + log.read_text(errors="replace")[-4000:]
