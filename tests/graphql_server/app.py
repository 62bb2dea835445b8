"""The GraphQL test project for a WSGI server (``wsgi``) and an ASGI one (``asgi``)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.graphql_server.settings")

from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application

asgi = get_asgi_application()
wsgi = get_wsgi_application()
