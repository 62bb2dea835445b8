"""The three clients (requests, httpx, async httpx), driven the same way by every test:
the client's own (tests/test_clients.py) and the repository's against idempotency-django
(its tests/test_client.py, which finds this module on its pythonpath)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import requests

from idempotency_client import AsyncIdempotentClient, IdempotentClient

KINDS = ["requests", "httpx", "httpx-async"]


class Api:
    """One of the three clients, made per call as an application would make it.

    ``auth`` and ``headers`` are the session's own. Every wait is recorded in
    ``sleeps`` (and slept with ``sleep``, by default for real).
    """

    def __init__(
        self,
        kind: str,
        *,
        auth: tuple[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        reauthenticate: Callable[[], dict[str, str]] | None = None,
        **options: Any,
    ) -> None:
        self.kind, self.auth, self.options = kind, auth, options
        self.headers = dict(headers or {})
        self.reauthenticate = reauthenticate
        self.sleeps: list[float] = []
        self._sleep = sleep

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._sleep(seconds)

    def post(self, url: str, **options: Any) -> Any:
        return self.request("POST", url, **options)

    def request(self, method: str, url: str, **options: Any) -> Any:
        common = {"sleep": self.sleep, "reauthenticate": self.reauthenticate, **self.options}
        if self.kind == "requests":
            with requests.Session() as session:
                session.auth = self.auth
                session.headers.update(self.headers)
                return IdempotentClient(session, **common).request(method, url, **options)
        if self.kind == "httpx":
            with httpx.Client(auth=self.auth, headers=self.headers) as client:
                return IdempotentClient(client, **common).request(method, url, **options)
        return asyncio.run(self._request_async(method, url, options))

    async def _request_async(self, method: str, url: str, options: dict[str, Any]) -> Any:
        async def sleep(seconds: float) -> None:
            self.sleep(seconds)  # blocking is fine: this loop runs nothing else

        async def reauthenticate() -> dict[str, str]:
            assert self.reauthenticate is not None
            return self.reauthenticate()

        async with httpx.AsyncClient(auth=self.auth, headers=self.headers) as client:
            api = AsyncIdempotentClient(
                client,
                sleep=sleep,
                reauthenticate=reauthenticate if self.reauthenticate else None,
                **self.options,
            )
            return await api.request(method, url, **options)
