"""A protected view's calls to other Idempotency-Key APIs, as docs/downstream.md shows them.

tests/test_downstream.py runs both views against a stand-in payment provider that
honours Idempotency-Key as Stripe does, and shows a retry charges once.
"""

from __future__ import annotations

# --8<-- [start:stripe]
import requests
from django.conf import settings
from django.http import HttpRequest, JsonResponse

from idempotency_django import downstream_key, idempotent


@idempotent(required=True)
def pay_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    # Stripe's API deduplicates on Idempotency-Key: this request's retries
    # (after a timeout, a crash, a takeover) send the same key, and are charged once.
    answer = requests.post(
        f"{settings.PAYMENTS_API_URL}/v1/payment_intents",
        data={"amount": 4200, "currency": "eur", "metadata[invoice]": invoice_id},
        headers={"Idempotency-Key": downstream_key(request, "charge")},
        auth=(settings.PAYMENTS_API_KEY, ""),
        timeout=10,
    )
    answer.raise_for_status()  # the view fails, the key is released: the retry runs again
    return JsonResponse({"payment": answer.json()["id"]}, status=201)


# --8<-- [end:stripe]

# --8<-- [start:client]
from idempotency_client import IdempotentClient  # noqa: E402


@idempotent(required=True)
def ship_order(request: HttpRequest, order_id: int) -> JsonResponse:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {settings.WAREHOUSE_API_TOKEN}"
    warehouse = IdempotentClient(session)  # retries a lost answer with the same key
    shipment = warehouse.post(
        f"{settings.WAREHOUSE_API_URL}/shipments/",
        json={"order": order_id},
        key=downstream_key(request, "shipment"),  # and so does a retry of this request
    )
    return JsonResponse({"shipment": shipment.json()["id"]}, status=201)


# --8<-- [end:client]
