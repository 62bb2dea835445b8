"""Views that run idempotent tasks in-process, for tests/test_task_views.py's real server."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from idempotency_django import downstream_key
from tests import django_tasks_app, tasks_app


def book_under_the_clients_key(request: HttpRequest) -> JsonResponse:
    """The wrong way: the client's raw key as the task's, global to the task."""
    slot = request.POST["slot"]
    booked = tasks_app.book(slot, idempotency_key=request.headers["Idempotency-Key"])
    return JsonResponse(booked, status=201)


def book_under_a_downstream_key(request: HttpRequest) -> JsonResponse:
    """The documented way: a key derived from the request, scoped to its principal."""
    slot = request.POST["slot"]
    booked = tasks_app.book(slot, idempotency_key=downstream_key(request, "book"))
    return JsonResponse(booked, status=201)


def book_now(request: HttpRequest) -> JsonResponse:
    """The ImmediateBackend runs the task in this request's transaction (ATOMIC_REQUESTS).

    ``?fail=1``: the view then fails, and the transaction rolls back with the task's work.
    """
    result = django_tasks_app.book_now.enqueue(request.POST["slot"])
    if request.GET.get("fail"):
        raise RuntimeError("the view fails after the task ran")
    return JsonResponse({"status": result.status.name}, status=201)
