"""Webhook receivers as docs/webhooks.md shows them; tests/test_docs.py drives them."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import time

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from idempotency_django.webhooks import deduplicate_webhook
from tests.testapp.models import Booking

WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


# --8<-- [start:standard_webhooks]
TOLERANCE = 5 * 60  # seconds between webhook-timestamp and now


def verify_standard_webhook(secret):
    """Refuse a delivery whose Standard Webhooks signature does not match (401)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))

    def decorate(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            msg_id = request.headers.get("webhook-id", "")
            timestamp = request.headers.get("webhook-timestamp", "")
            if not msg_id or not timestamp.isdigit():
                return JsonResponse({"status": "unsigned"}, status=401)
            if abs(time.time() - int(timestamp)) > TOLERANCE:
                return JsonResponse({"status": "stale"}, status=401)
            signed = f"{msg_id}.{timestamp}.".encode() + request.body  # the raw body
            expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            offered = [
                signature.split(",", 1)[-1]
                for signature in request.headers.get("webhook-signature", "").split()
                if signature.startswith("v1,")
            ]
            if not any(hmac.compare_digest(expected, candidate) for candidate in offered):
                return JsonResponse({"status": "bad signature"}, status=401)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


@csrf_exempt
@require_POST
@verify_standard_webhook(WEBHOOK_SECRET)  # first: only a genuine delivery...
@deduplicate_webhook(id_header="webhook-id")  # ...may claim its signed webhook-id
def standard_receiver(request, token):
    run = Booking.objects.create(slot="standard-webhook-run")
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


# --8<-- [end:standard_webhooks]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """What a Standard Webhooks sender puts in webhook-signature."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
