"""Views that book (a ``Booking`` row per run), then end their transaction otherwise
than their answer says: rolled back behind a 2xx, failing at COMMIT, or committed on
one database while a hook of the view raises."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connection, transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency_django import idempotent
from tests import tasks_app
from tests.real_stack.views import QueuedForLater
from tests.testapp.models import Booking

#: An owner that does not exist: the foreign key fails at COMMIT where Django defers it
#: (PostgreSQL, SQLite), at the INSERT where it cannot (MariaDB): either way the work
#: does not commit.
MISSING_OWNER = 10**9


def _book(request: HttpRequest, slot: str) -> Booking:
    owner_id = MISSING_OWNER if "HTTP_X_BREAK_COMMIT" in request.META else None
    return Booking.objects.create(slot=slot, owner_id=owner_id)


def _rolled_back(request: HttpRequest, slot: str) -> dict[str, Any]:
    """Books, then rolls the transaction back and answers 201 all the same (a dry run,
    or a view that caught its own failure and says so in its body)."""
    booking = _book(request, slot)
    transaction.set_rollback(True)
    return {"id": booking.pk}


# -- 201 answers whose transaction rolled back -------------------------------------


def rolled_back(request: HttpRequest) -> HttpResponse:
    """A plain view: the middleware protects it (a savepoint under ATOMIC_REQUESTS)."""
    return JsonResponse(_rolled_back(request, "rolled-back"), status=201)


def order_then_task(request: HttpRequest) -> HttpResponse:
    """Writes the order, then runs a task in-process under a task key already used with
    other arguments: ``TaskKeyReused``, which the middleware answers 409."""
    _book(request, "order")
    tasks_app.book("09:00", idempotency_key="shared-task-key")
    return JsonResponse({"ok": True}, status=201)


def cancel(request: HttpRequest) -> HttpResponse:
    """Books (a cancellation's own row), then finds nothing to cancel: Http404."""
    _book(request, "cancel")
    raise Http404("no such booking")  # get_object_or_404


def forbidden(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied


class AuditMiddleware:
    """A project's middleware (before the idempotency one): each request's audit row, in
    a transaction of its own around the rest."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        with transaction.atomic():
            Booking.objects.create(slot="audit")
            return self.get_response(request)


def queued(request: HttpRequest) -> HttpResponse:
    """Books, then raises; ``QueueingMiddleware`` (after the idempotency one) answers 202."""
    _book(request, "queued")
    raise QueuedForLater


@idempotent(atomic=True)
def decorated_rolled_back(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_rolled_back(request, "decorated-rolled-back"), status=201)


@api_view(["POST"])
@idempotent
def drf_rolled_back(request: Request) -> Response:
    return Response(_rolled_back(request, "drf-rolled-back"), status=201)


@idempotent(atomic=True)
class RolledBackViewSet(viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return Response(_rolled_back(request, "viewset-rolled-back"), status=201)


# -- a COMMIT that fails ----------------------------------------------------------


def booking(request: HttpRequest) -> HttpResponse:
    """A plain view; with ``X-Break-Commit`` its work does not commit."""
    return JsonResponse({"id": _book(request, "plain").pk}, status=201)


@idempotent(atomic=True)
def decorated_booking(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"id": _book(request, "decorated").pk}, status=201)


@api_view(["POST"])
@idempotent(atomic=True)
def drf_booking(request: Request) -> Response:
    return Response({"id": _book(request, "drf").pk}, status=201)


@api_view(["POST"])
@idempotent
def drf_plain_booking(request: Request) -> Response:
    """No transaction of its own: under ``ATOMIC_REQUESTS``, Django's around the view."""
    return Response({"id": _book(request, "drf-plain").pk}, status=201)


# -- two databases ----------------------------------------------------------------


def two_databases(request: HttpRequest) -> HttpResponse:
    """Books on the default database and on ``other`` (each in its ``ATOMIC_REQUESTS``
    transaction). ``X-Break-Commit``: the part on ``other`` does not commit.
    ``X-Failing-Hook``: a confirmation hooked on ``other``'s commit raises (Django's
    default ``on_commit`` is not robust)."""
    Booking.objects.create(slot="default-part")
    owner_id = MISSING_OWNER if "HTTP_X_BREAK_COMMIT" in request.META else None
    booked = Booking.objects.using("other").create(slot="other-part", owner_id=owner_id)
    if "HTTP_X_FAILING_HOOK" in request.META:

        def send_confirmation() -> None:
            raise ConnectionError("the mail server is down")

        transaction.on_commit(send_confirmation, using="other")
    return JsonResponse({"id": booked.pk}, status=201)


# -- a DRF handler that answers with no Response ------------------------------------


@idempotent(atomic=True)
class NoResponseAtomicViewSet(viewsets.ViewSet):
    """Books, then returns a dict: DRF's ``finalize_response`` refuses it (an assertion)."""

    def create(self, request: Request) -> Any:
        return {"id": _book(request, "no-response-atomic").pk}


@idempotent
class NoResponseViewSet(viewsets.ViewSet):
    def create(self, request: Request) -> Any:
        return {"id": _book(request, "no-response").pk}


# -- a database error the view swallows inside its transaction ----------------------


def _swallow_a_database_error(request: HttpRequest, slot: str) -> dict[str, Any]:
    """Books, then swallows a database error without a savepoint of its own (what
    Django's docs warn against). PostgreSQL aborts the transaction: its COMMIT rolls
    back without an error, and Django runs the ``on_commit`` hooks all the same."""
    booked = _book(request, slot)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_at_all")
    except DatabaseError:
        pass
    return {"id": booked.pk}


@idempotent(atomic=True)
def swallowed_error(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_swallow_a_database_error(request, "swallowed"), status=201)


@api_view(["POST"])
@idempotent
def drf_swallowed_error(request: Request) -> Response:
    """No transaction of its own: under ``ATOMIC_REQUESTS``, Django's around the view."""
    return Response(_swallow_a_database_error(request, "drf-swallowed"), status=201)
