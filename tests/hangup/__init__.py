"""Clients that hang up: real servers (uvicorn, daphne, gunicorn), a real login with CSRF
enforced, and a socket closed while the work runs, as on a train that loses its signal."""
