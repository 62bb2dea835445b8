"""``tests.hangup.settings`` (its ``HANGUP_*`` variants), with the matrix's views added."""

from __future__ import annotations

from tests.hangup.settings import *  # noqa: F403
from tests.hangup.settings import DATABASES

ROOT_URLCONF = "tests.hangup_matrix.urls"

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Up to 16 writers at once queue for SQLite's one write lock: wait for it as long as
    # a view of these tests may hold it, so that what is tested is the hang-up, not a
    # claim or a completion that gave up on the lock ("database is locked" is the store
    # down: a completion that fails keeps its key to LOCK_TIMEOUT, by design).
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}), "timeout": 30}
