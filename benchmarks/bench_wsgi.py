"""The WSGI application gunicorn serves in the HTTP benchmarks."""

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
