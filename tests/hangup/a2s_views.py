"""Sync views that call async code mid-work (``async_to_sync``: a channel layer's
``group_send``; a signal with an async receiver), each protected by a door inside the
view: ``@idempotent``, DRF, a webhook receiver, django-ninja. Each run books two rows,
one before the async call and one after it."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal, receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.security import django_auth
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from idempotency_django import idempotent
from idempotency_django.ninja import idempotent as ninja_idempotent
from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking


def _delay(request: HttpRequest) -> float:
    return float(request.GET.get("delay", 0))


async def group_send(seconds: float) -> None:
    """What a channel layer's ``group_send`` is to the view: async work it waits for."""
    await asyncio.sleep(seconds)


def _book_around_async_call(request: HttpRequest, slot: str) -> None:
    Booking.objects.create(slot=f"{slot}-1")
    async_to_sync(group_send)(_delay(request))
    Booking.objects.create(slot=f"{slot}-2")


@idempotent
def decorated(request: HttpRequest) -> HttpResponse:
    _book_around_async_call(request, "decorated")
    return JsonResponse({"ok": 1}, status=201)


@api_view(["POST"])
@idempotent
def drf(request: Request) -> Response:
    _book_around_async_call(request, "drf")
    return Response({"ok": 1}, status=201)


@deduplicate_webhook(id_header="Webhook-Id")
def webhook(request: HttpRequest, token: str) -> HttpResponse:
    _book_around_async_call(request, "hook")
    return JsonResponse({"status": "accepted"}, status=202)


api = NinjaAPI(urls_namespace="hangup-a2s")


@api.post("/ninja", auth=django_auth)
@ninja_idempotent
def ninja_operation(request: HttpRequest) -> Any:
    _book_around_async_call(request, "ninja")
    return {"ok": 1}


booked = Signal()


@receiver(booked)
async def send_confirmation(sender: Any, delay: float, **kwargs: Any) -> None:
    """An async receiver: ``Signal.send()`` runs it through ``async_to_sync``."""
    await asyncio.sleep(delay)


@idempotent
def signalled(request: HttpRequest) -> HttpResponse:
    Booking.objects.create(slot="signal-1")
    booked.send(sender=None, delay=_delay(request))
    Booking.objects.create(slot="signal-2")
    return JsonResponse({"ok": 1}, status=201)
