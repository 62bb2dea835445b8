"""A real HTTP server on 127.0.0.1 that records what it receives and answers as told."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"{}"


class Recorder:
    """``answers`` maps a path to the answers of its first requests, in order; any
    other request is answered ``201 {}``."""

    def __init__(self, answers: dict[str, list[Answer]] | None = None) -> None:
        self.seen: list[Seen] = []
        queues = {path: list(planned) for path, planned in (answers or {}).items()}
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                recorder.seen.append(Seen(self.command, self.path, dict(self.headers), body))
                planned = queues.get(self.path)
                answer = planned.pop(0) if planned else Answer(201)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_POST = do_PUT = do_PATCH = do_DELETE = answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        # A short poll: shutdown() waits for it, and a test starts many servers.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    """A port nothing listens on (a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
