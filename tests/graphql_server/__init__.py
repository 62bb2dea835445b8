"""The GraphQL door (idempotency_django.graphql) on real servers: gunicorn and uvicorn."""
