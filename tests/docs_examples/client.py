"""A retrying client for an idempotent API, as docs/clients.md describes.

Exercised against the example project by tests/test_example_project.py.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


# --8<-- [start:client]
@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotency-replayed") == "true"

    def problem_code(self) -> str | None:
        if self.headers.get("content-type") != "application/problem+json":
            return None
        return json.loads(self.body).get("code")


@dataclass
class RetryPolicy:
    attempts: int = 5  # cap the attempts...
    budget: float = 30.0  # ...and the total time, in seconds
    base: float = 0.25
    cap: float = 8.0
    sleep: Callable[[float], None] = field(default=time.sleep)

    def backoff(self, attempt: int) -> float:
        # Exponential backoff with full jitter: workers do not retry in step.
        return random.uniform(0, min(self.cap, self.base * 2**attempt))


class PermanentFailure(Exception):
    """Retrying the same request cannot help: fix it (or reconcile a key conflict)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"{answer.status} {answer.problem_code() or ''}".strip())
        self.answer = answer


def send(url: str, body: bytes, key: str, headers: dict[str, str], timeout: float) -> Answer:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    for name, value in {**headers, "Idempotency-Key": key}.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, _lower(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, _lower(error.headers), error.read())


def post_idempotently(
    url: str,
    payload: dict[str, object],
    *,
    headers: dict[str, str],
    key: str | None = None,
    exchange_credentials: Callable[[], dict[str, str]] | None = None,
    policy: RetryPolicy | None = None,
    timeout: float = 10.0,
) -> Answer:
    """POST ``payload`` once, however many attempts it takes.

    The key is made ONCE, before the first attempt (or derived from your own
    operation id), and every retry sends the same method, URL, body bytes and key.
    """
    policy = policy or RetryPolicy()
    key = key or str(uuid.uuid4())  # never inside the loop
    body = json.dumps(payload).encode()  # the same bytes on every attempt
    deadline = time.monotonic() + policy.budget
    exchanged = False
    for attempt in range(1, policy.attempts + 1):
        try:
            answer = send(url, body, key, headers, timeout)
        except OSError:  # a timeout or a dropped connection: did it run? The key knows.
            wait = policy.backoff(attempt)
        else:
            code = answer.problem_code()
            if answer.status < 400:
                return answer  # the work's answer, or its replay
            if answer.status == 401 and exchange_credentials and not exchanged:
                headers = {**headers, **exchange_credentials()}  # exchange once, retry once
                exchanged = True
                continue
            if answer.status == 409 and code == "idempotency_key_in_progress":
                wait = float(answer.headers.get("retry-after", 1))  # the winner's answer soon
            elif answer.status == 429:
                wait = float(answer.headers.get("retry-after", policy.backoff(attempt)))
            elif answer.status >= 500:  # 500, 503 idempotency_unavailable: nothing was kept
                wait = float(answer.headers.get("retry-after", 0)) or policy.backoff(attempt)
            else:
                # 400, 403, 404, 409 idempotency_key_reused, 413, 422: not retryable
                # unchanged. Never "fix" a 409 by generating a new key.
                raise PermanentFailure(answer)
        if attempt == policy.attempts or time.monotonic() + wait > deadline:
            break
        policy.sleep(wait)
    raise TimeoutError(f"gave up after {attempt} attempts; retry later with key {key!r}")


# --8<-- [end:client]


def _lower(headers: object) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in headers.items()}  # type: ignore[attr-defined]
