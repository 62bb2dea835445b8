"""factory-boy factories for the app's models."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

from django.utils import timezone
from factory.declarations import LazyAttribute, LazyFunction, Sequence, Trait
from factory.django import DjangoModelFactory

from idempotency_django.models import IdempotencyRecord


class IdempotencyRecordFactory(DjangoModelFactory[IdempotencyRecord]):
    """A live completed record by default.

    ``in_progress=True`` makes a live reservation; ``expired=True`` puts
    ``expires_at`` in the past (with ``in_progress``: an abandoned reservation).
    """

    class Meta:
        model = IdempotencyRecord

    class Params:
        in_progress = Trait(
            state=IdempotencyRecord.State.IN_PROGRESS,
            status_code=None,
            response_headers=[],
            response_body=b"",
            completed_at=None,
            expires_at=LazyAttribute(lambda o: o.created_at + timedelta(seconds=300)),
        )
        expired = Trait(
            created_at=LazyFunction(lambda: timezone.now() - timedelta(days=2)),
            expires_at=LazyFunction(lambda: timezone.now() - timedelta(seconds=1)),
        )

    principal = Sequence(lambda n: f"user:{n % 7}")
    location = ""
    key = LazyFunction(lambda: str(uuid.uuid4()))
    fingerprint = LazyAttribute(lambda o: hashlib.sha256(o.key.encode()).hexdigest())
    method = "POST"
    path = "/plain/bookings/"
    request_id = Sequence(lambda n: f"req-{n}")
    state = IdempotencyRecord.State.COMPLETED
    token = LazyFunction(lambda: uuid.uuid4().hex)
    status_code = 201
    response_headers = LazyFunction(lambda: [["Content-Type", "application/json"]])
    response_body = b'{"id": 1, "status": "booked"}'
    created_at = LazyFunction(timezone.now)
    completed_at = LazyAttribute(lambda o: o.created_at)
    expires_at = LazyAttribute(lambda o: o.created_at + timedelta(days=1))
