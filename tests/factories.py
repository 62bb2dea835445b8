"""factory-boy factories for the app's models."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from idempotency_django.models import IdempotencyRecord


class IdempotencyRecordFactory(factory.django.DjangoModelFactory):
    """A live completed record by default.

    ``in_progress=True`` makes a live reservation; ``expired=True`` puts
    ``expires_at`` in the past (with ``in_progress``: an abandoned reservation).
    """

    class Meta:
        model = IdempotencyRecord

    class Params:
        in_progress = factory.Trait(
            state=IdempotencyRecord.State.IN_PROGRESS,
            status_code=None,
            response_headers=[],
            response_body=b"",
            completed_at=None,
            expires_at=factory.LazyAttribute(lambda o: o.created_at + timedelta(seconds=300)),
        )
        expired = factory.Trait(
            created_at=factory.LazyFunction(lambda: timezone.now() - timedelta(days=2)),
            expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1)),
        )

    principal = factory.Sequence(lambda n: f"user:{n % 7}")
    location = ""
    key = factory.LazyFunction(lambda: str(uuid.uuid4()))
    fingerprint = factory.LazyAttribute(lambda o: hashlib.sha256(o.key.encode()).hexdigest())
    method = "POST"
    path = "/plain/bookings/"
    request_id = factory.Sequence(lambda n: f"req-{n}")
    state = IdempotencyRecord.State.COMPLETED
    token = factory.LazyFunction(lambda: uuid.uuid4().hex)
    status_code = 201
    response_headers = factory.LazyFunction(lambda: [["Content-Type", "application/json"]])
    response_body = b'{"id": 1, "status": "booked"}'
    created_at = factory.LazyFunction(timezone.now)
    completed_at = factory.LazyAttribute(lambda o: o.created_at)
    expires_at = factory.LazyAttribute(lambda o: o.created_at + timedelta(days=1))
