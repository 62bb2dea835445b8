"""A Standard Webhooks receiver of the test project with docs/webhooks.md's own verifier;
tests/test_docs.py and tests/test_security.py send it deliveries."""

from __future__ import annotations

import base64
import hashlib
import hmac

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from idempotency_django.webhooks import deduplicate_webhook
from tests.docs_blocks import block_defining, run_page_code
from tests.testapp.models import Booking

WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

_VERIFIER = block_defining("docs/webhooks.md", "verify_standard_webhook")
verify_standard_webhook = run_page_code("docs/webhooks.md", {}, _VERIFIER)[
    "verify_standard_webhook"
]


@csrf_exempt
@require_POST
@verify_standard_webhook(WEBHOOK_SECRET)  # first: only a genuine delivery...
@deduplicate_webhook(id_header="webhook-id")  # ...may claim its signed webhook-id
def standard_receiver(request, token):
    run = Booking.objects.create(slot="standard-webhook-run")
    return JsonResponse({"status": "accepted", "run_id": run.pk}, status=202)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """What a Standard Webhooks sender puts in webhook-signature."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
