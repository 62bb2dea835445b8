"""The test settings with tests/downstream_urls.py, for the server tests/test_downstream.py runs."""

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.downstream_urls"
