"""The test project as these servers run it: the GraphQL endpoints."""

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.graphql_server.urls"
