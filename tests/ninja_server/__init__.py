"""The django-ninja integration on real servers (gunicorn, uvicorn), real sockets, a real login."""
