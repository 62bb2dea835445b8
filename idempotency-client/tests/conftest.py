"""Every test that takes ``kind`` runs with each of the three clients (three_clients.py)."""

from __future__ import annotations

import pytest
from three_clients import KINDS


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
