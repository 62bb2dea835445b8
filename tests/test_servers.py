"""The readiness polling of tests that start servers: a booting server is "not yet".

Real sockets stand in for the states a gunicorn passes through while it boots on a
loaded machine; the tests that start servers (scale-out, the example project, uvicorn)
wait through tests/servers.py.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests import servers
from tests.test_scale_out import ready


@contextlib.contextmanager
def listening(answer: bytes | None) -> Iterator[str]:
    """A socket on a free port: silent when ``answer`` is None (the kernel accepts
    connections into its backlog, nobody reads: what a gunicorn whose workers are
    still importing does), else it sends ``answer`` to each connection and closes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        stop = threading.Event()

        def serve() -> None:
            sock.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.recv(65536)
                    conn.sendall(answer or b"")

        thread = threading.Thread(target=serve, daemon=True)
        if answer is not None:
            thread.start()
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            stop.set()
            if answer is not None:
                thread.join(5)


@pytest.mark.parametrize(
    "answer",
    [None, b"", b"garbage\r\n"],
    ids=["accepts-but-silent", "closes", "bad-status-line"],
)
def test_a_booting_server_is_not_ready_yet(answer: bytes | None) -> None:
    """The scale-out readiness check said "not yet" only to refused connections: a read
    timeout (TimeoutError) or a bad status line (HTTPException) escaped and failed the
    test while gunicorn booted."""
    with listening(answer) as base:
        assert ready(base) is False


def test_a_real_answer_is_its_status() -> None:
    with listening(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") as base:
        assert servers.status(base + "/") == 403


def test_waiting_fails_at_once_when_the_server_exits() -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 3"):
        servers.wait_until(lambda: False, process, what="the server")
    assert time.monotonic() - started < 10


def test_waiting_gives_up_at_its_deadline() -> None:
    with pytest.raises(RuntimeError, match="did not come up within 1 s"):
        servers.wait_until(lambda: False, what="nothing", seconds=1)
