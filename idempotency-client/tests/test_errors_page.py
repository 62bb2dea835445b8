"""The client against docs/errors.md: each documented problem response, served over
real HTTP, gets what the page's "Retry with the same key?" column says.

The page is the server's contract (the repository's tests/test_docs.py checks that
every example on it is what idempotency-django sends); this checks the client's
side of it without Django.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from http_recorder import Answer, Recorder
from three_clients import Api

import idempotency_client
from idempotency_client import RequestRejected, RetryPolicy

PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
TEXT = PAGE.read_text()
#: | [`code`](#code) | status | Retry with the same key? |
ROWS = {
    code: (int(status), advice)
    for code, status, advice in re.findall(
        r"^\| \[`([a-z_]+)`\]\(#\1\) \| (\d{3}) \| (.+?) \|$", TEXT, re.MULTILINE
    )
}


def example(code: str) -> Answer:
    """The example response under the code's heading, as the server sends it."""
    section = TEXT.split(f"## `{code}`\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```http\n(.*?)\n```", section, re.DOTALL)
    assert block, code
    head, body = block[1].split("\n\n", 1)
    status_line, *header_lines = head.splitlines()
    headers = dict(line.split(": ", 1) for line in header_lines)
    return Answer(int(status_line.split()[1]), headers, body.encode())


def test_the_page_has_the_table_and_the_codes_the_client_knows() -> None:
    assert len(ROWS) >= 10
    assert ROWS[idempotency_client.KEY_IN_PROGRESS][0] == 409
    assert ROWS[idempotency_client.KEY_REUSED][0] == 409
    assert ROWS[idempotency_client.UNAVAILABLE][0] == 503
    for code in ROWS:
        answer = example(code)
        assert answer.status == ROWS[code][0], code
        assert answer.headers["Content-Type"] == idempotency_client.PROBLEM_CONTENT_TYPE, code


# Webhook codes answer a webhook sender (it retries), not this client's callers.
API_CODES = sorted(code for code in ROWS if not code.startswith("webhook_"))


@pytest.mark.parametrize("code", API_CODES)
def test_the_client_does_what_the_page_says(code: str) -> None:
    status, advice = ROWS[code]
    answer = example(code)
    exchanges: list[int] = []

    def exchange() -> dict[str, str]:
        exchanges.append(1)
        return {"Authorization": "Bearer fresh"}

    # A budget that holds the server's Retry-After (a day, for too many keys): a
    # shorter one stops at once instead, and tests/test_decision.py shows that.
    budget = float(answer.headers.get("Retry-After", 0)) + 60.0
    with Recorder({"/op/": [answer]}) as api:
        client = Api("requests", policy=RetryPolicy(max_elapsed=budget), sleep=lambda _: None)
        client.reauthenticate = exchange
        if advice.startswith("Yes"):
            assert client.post(f"{api.base}/op/", json={}).status_code == 201
            retry_after = answer.headers.get("Retry-After")
            assert ("after `Retry-After`" in advice) == (retry_after is not None), code
            if retry_after is not None:
                assert client.sleeps == [float(retry_after)]  # the server's pace
        elif advice == "After authenticating":
            assert client.post(f"{api.base}/op/", json={}).status_code == 201
            assert exchanges == [1] and client.sleeps == [0.0]
        else:
            assert advice.startswith(("No", "Send one")), advice
            with pytest.raises(RequestRejected) as rejected:
                client.post(f"{api.base}/op/", json={})
            assert (rejected.value.status, rejected.value.code) == (status, code)
            assert client.sleeps == []
    assert len(api.seen) == (1 if client.sleeps == [] else 2)
