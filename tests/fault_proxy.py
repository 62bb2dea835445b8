"""A TCP proxy, in a thread, that breaks chosen exchanges between a client and a server.

Each client connection carries one request: the proxy asks the server to close
after answering and tells the client the same, so that "the n-th request" is
well defined however the client pools its connections. For each request the
proxy records what the client sent, then does what its plan says for that
request (the plan's last step repeats):

* ``FORWARD``: forward the request, then the server's whole answer;
* ``DROP``: forward the request, read the server's whole answer (so the work is
  done and committed), then reset the client's connection without a byte of it;
* ``HOLD``: like ``DROP``, but keep the client's connection open and silent until
  the client gives up (its read timeout);
* ``Answer(...)``: answer by itself, without reaching the server (a gateway's 429
  or 502).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

FORWARD, DROP, HOLD = "forward", "drop", "hold"
HOLD_AT_MOST = 30.0


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} {self.reason}", "Content-Length: 0"]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode()


Step = str | Answer


@dataclass(frozen=True)
class Exchange:
    """One request as the client sent it, and the status the server answered."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    step: Step
    upstream_status: int | None


class FaultProxy:
    def __init__(self, upstream_port: int, plan: list[Step]) -> None:
        self.upstream_port = upstream_port
        self.plan = list(plan)
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        # close() does not wake a thread blocked in accept(): poll, and watch for stop.
        self._listener.settimeout(0.05)
        self._stopping = threading.Event()
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> None:
        self._accepting.start()

    def stop(self) -> None:
        self._stopping.set()
        self._accepting.join(timeout=5)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=HOLD_AT_MOST + 5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next_step(self) -> Step:
        with self._lock:
            return self.plan.pop(0) if len(self.plan) > 1 else self.plan[0]

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(HOLD_AT_MOST)
            request = _read_request(conn)
            if request is None:  # a connection opened and closed without a request
                return
            head, body = request
            step = self._next_step()
            upstream_status = None
            if isinstance(step, Answer):
                answer = step.encode()
            else:
                answer = self._ask_server(_close_after(head) + body)
                upstream_status = int(answer.split(b" ", 2)[1])
            self._record(head, body, step, upstream_status)
            if step == DROP:
                # Linger 0: close() sends a reset, as a dying load balancer would.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif step == HOLD:
                try:
                    while conn.recv(65536):
                        pass  # until the client closes its end
                except OSError:
                    pass
            else:
                conn.sendall(_close_after(answer))

    def _ask_server(self, request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60) as up:
            up.sendall(request)
            chunks = []
            while chunk := up.recv(65536):  # the server closes after its answer
                chunks.append(chunk)
        return b"".join(chunks)

    def _record(self, head: bytes, body: bytes, step: Step, upstream_status: int | None) -> None:
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            if line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        with self._lock:
            self.exchanges.append(Exchange(method, path, headers, body, step, upstream_status))


def _read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The head (through the blank line) and the Content-Length body of one request."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n", body


def _close_after(message: bytes) -> bytes:
    """The message with ``Connection: close`` instead of whatever it asked for."""
    head, _, rest = message.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + rest


@contextmanager
def fault_proxy(upstream_port: int, plan: list[Step]) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream_port, plan)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
