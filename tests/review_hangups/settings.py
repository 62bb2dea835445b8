"""``tests.hangup.settings`` (its ``HANGUP_*`` variants), with the review's views added."""

from __future__ import annotations

from tests.hangup.settings import *  # noqa: F403

ROOT_URLCONF = "tests.review_hangups.urls"
