"""The test project's GraphQL schema: mutations that book a slot, one row per run."""

from __future__ import annotations

import asyncio
import enum
import time
from decimal import Decimal

import strawberry
from asgiref.sync import sync_to_async
from django.http import HttpRequest

from idempotency_django.graphql import Idempotent
from idempotency_django.protocol.scope import principal_of
from tests.testapp.models import Booking


@strawberry.enum
class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


@strawberry.type
class Slot:
    name: str
    size: Size


@strawberry.type
class BookingOut:
    id: int
    customer: str
    slot: Slot
    price: Decimal
    tags: list[str]

    @strawberry.field
    def label(self) -> str:
        return f"{self.slot.name} for {self.customer}"


@strawberry.input
class SlotIn:
    name: str
    size: Size = Size.SMALL


def _book(request: HttpRequest, slot: SlotIn, fail: bool) -> BookingOut:
    user = request.user if request.user.is_authenticated else None
    booking = Booking.objects.create(
        slot=slot.name, customer=principal_of(user) or "anonymous", owner=user
    )
    if fail:
        raise ValueError("the booking failed after its write")
    return BookingOut(
        id=booking.pk,
        customer=booking.customer,
        slot=Slot(name=slot.name, size=slot.size),
        price=Decimal("12.50"),
        tags=["new"],
    )


@strawberry.type
class Query:
    @strawberry.field
    def bookings(self) -> int:
        return Booking.objects.count()


# --8<-- [start:mutation]
@strawberry.type
class Mutation:
    @strawberry.mutation(extensions=[Idempotent()])
    def book(
        self, info: strawberry.Info, slot: SlotIn, delay: float = 0, fail: bool = False
    ) -> BookingOut:
        time.sleep(delay)
        return _book(info.context.request, slot, fail)
        # --8<-- [end:mutation]

    @strawberry.mutation(extensions=[Idempotent()])
    async def book_async(
        self, info: strawberry.Info, slot: SlotIn, delay: float = 0, fail: bool = False
    ) -> BookingOut:
        await asyncio.sleep(delay)
        return await sync_to_async(_book)(info.context.request, slot, fail)

    @strawberry.mutation(extensions=[Idempotent()])
    def count(self, info: strawberry.Info, slot: str) -> int:
        return Booking.objects.create(slot=slot).pk

    @strawberry.mutation(extensions=[Idempotent(window=2)])
    def count_windowed(self, info: strawberry.Info, slot: str) -> int:
        """For clients that send no key: the same call within 2 s is answered once."""
        return Booking.objects.create(slot=slot).pk

    @strawberry.mutation
    def unprotected(self, slot: str) -> int:
        return Booking.objects.create(slot=slot).pk


schema = strawberry.Schema(query=Query, mutation=Mutation)
