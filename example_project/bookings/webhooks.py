"""Two webhook receivers: the generic one of /hooks/<token>/ and a Standard Webhooks one.

docs/webhooks.md shows this code (tests/test_docs.py checks that its blocks are lines of
this file); tests/test_example_project.py sends both their deliveries.
"""

import base64
import functools
import hashlib
import hmac
import json
import time

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from bookings.models import WebhookRun
from idempotency_django.webhooks import deduplicate_webhook


def start_run(request):
    """The work of an accepted delivery: one run per event."""
    try:
        event = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"status": "invalid"}, status=400)  # not recorded: retried
    kind = event.get("type", "") if isinstance(event, dict) else ""
    run = WebhookRun.objects.create(event=str(kind)[:128])
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


def idempotency_key_or_fallback(request):
    """The sender's Idempotency-Key; without one, None: the fallback identity (the
    trigger token and the raw body, in a 5-minute bucket)."""
    return request.headers.get("Idempotency-Key") or None


@csrf_exempt  # a sender has no CSRF token: the trigger token in the URL is the secret
@require_POST
@deduplicate_webhook(body_id=idempotency_key_or_fallback)
def webhook_receiver(request, token):
    """Each delivery starts one run; a duplicate gets 202 {"status": "duplicate"}."""
    return start_run(request)


TOLERANCE = 5 * 60  # seconds between webhook-timestamp and now


def verify_standard_webhook(secret):
    """Refuse a delivery whose Standard Webhooks signature does not match (401)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))

    def decorate(view):
        @functools.wraps(view)  # carries deduplicate_webhook's mark over
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
@verify_standard_webhook(settings.EXAMPLE_WEBHOOK_SECRET)  # first: only a genuine delivery...
@deduplicate_webhook(id_header="webhook-id")  # ...may claim its signed webhook-id
def standard_webhook_receiver(request, token):
    """A verified delivery starts one run; its retries are duplicates."""
    return start_run(request)
