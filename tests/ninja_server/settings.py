"""The test project as these servers run it: the ninja API, a login page.

Without ``IdempotencyMiddleware`` (a project that protects its ninja API with the
integration alone), unless ``NINJA_WITH_MIDDLEWARE=1``.
"""

from __future__ import annotations

import os

from tests.hangup.settings import *  # noqa: F403
from tests.hangup.settings import MIDDLEWARE

ROOT_URLCONF = "tests.ninja_server.urls"
if os.environ.get("NINJA_WITH_MIDDLEWARE") != "1":
    MIDDLEWARE = [
        name
        for name in MIDDLEWARE
        if name != "idempotency_django.middleware.IdempotencyMiddleware"
        and not name.startswith("tests.hangup.")
    ]
