"""Strawberry GraphQL: a mutation field that runs once per key, replayed after.

One marker on the field, a Strawberry field extension::

    from idempotency_django.graphql import Idempotent

    @strawberry.type
    class Mutation:
        @strawberry.mutation(extensions=[Idempotent()])
        def create_order(self, info: strawberry.Info, item: str) -> Order: ...

The field gains an ``idempotencyKey: String`` argument (Shopify's style: each
protected mutation of a request has its own key). A request with exactly one
protected mutation and no such argument may send the key in the
``Idempotency-Key`` header instead.

An extension, not a directive: the extension wraps the resolver's call, which
is where the key must be claimed, the work run and its answer kept; a
directive is schema metadata a client would have to send.

The key goes through the protocol every door does
([`phases.run`][idempotency_django.protocol.phases.run] and
[`arun`][idempotency_django.protocol.phases.arun] driving an
[`Attempt`][idempotency_django.protocol.attempt.Attempt]): scoped by the
request's principal and location as a view's is, refused with the REST
answers' codes (a ``GraphQLError`` whose ``extensions.code`` is
``idempotency_key_in_progress``, ...). The fingerprint is the field's name and
its arguments in canonical JSON, not the query text: a retry that asks for
other result fields still replays. What is kept is the resolver's return
value as JSON (a Strawberry type's fields, recursively); a replay rebuilds
the field's declared type from it.

This module imports Strawberry; nothing else in the package imports it
(``pip install idempotency-django[graphql]``).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from graphql import FieldNode, FragmentSpreadNode, GraphQLError, InlineFragmentNode
from graphql.language import SelectionSetNode
from strawberry.annotation import StrawberryAnnotation
from strawberry.extensions import FieldExtension
from strawberry.types import Info
from strawberry.types.arguments import StrawberryArgument
from strawberry.types.base import StrawberryList, StrawberryOptional, get_object_definition
from strawberry.types.field import StrawberryField
from strawberry.types.unset import UnsetType

from idempotency_django.protocol.fingerprint import keyed_digest
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import arun, begin, run
from idempotency_django.protocol.problems import PROBLEM_ATTRIBUTE
from idempotency_django.protocol.scope import Scope
from idempotency_django.protocol.transactions import view_transaction_of

__all__ = ["KEY_ARGUMENT", "Idempotent"]

#: The resolver argument (``idempotencyKey`` in the schema) that carries a mutation's key.
KEY_ARGUMENT = "idempotency_key"
#: Where Strawberry keeps a schema field's StrawberryField (GraphQLCoreConverter's backref).
_DEFINITION = "strawberry-definition"


class Idempotent(FieldExtension):
    """Run the mutation once per key and scope; answer its retries from the store.

    The options are the views' (None: the setting's). The transactions are the
    request's: under ``ATOMIC_REQUESTS`` or ``ATOMIC`` each sync mutation runs
    in a savepoint of its own, so that one that raises takes back its writes and
    its claim, and never another mutation's.
    """

    def __init__(
        self,
        *,
        required: bool | None = None,
        retention: int | None = None,
        wait_for_in_progress: float | None = None,
        scope: Callable[[HttpRequest], Scope | None] | str | None = None,
        window: int | None = None,
    ) -> None:
        self.options = ViewOptions(
            required=required,
            retention=retention,
            wait_for_in_progress=wait_for_in_progress,
            scope=scope,
            window=window,
        )
        self.field: StrawberryField | None = None
        self.adds_argument = True

    def apply(self, field: StrawberryField) -> None:
        self.field = field
        if any(argument.python_name == KEY_ARGUMENT for argument in field.arguments):
            self.adds_argument = False  # the resolver takes the key itself
            return
        key = StrawberryArgument(
            python_name=KEY_ARGUMENT,
            graphql_name=None,
            type_annotation=StrawberryAnnotation(str | None),
            default=None,
            description="Runs this mutation at most once per key; a retry gets its result.",
        )
        field.arguments = [*field.arguments, key]

    # -- resolving --

    def resolve(self, next_: Callable[..., Any], source: Any, info: Info, **kwargs: Any) -> Any:
        if _in_event_loop():
            # A sync resolver under an async view: the store's and the resolver's
            # blocking I/O may not run on the event loop.
            return sync_to_async(self.resolve_sync)(next_, source, info, kwargs)
        return self.resolve_sync(next_, source, info, kwargs)

    def resolve_sync(
        self, next_: Callable[..., Any], source: Any, info: Info, kwargs: dict[str, Any]
    ) -> Any:
        request, options, begin_phase = self.prepare(info, kwargs)
        ran: list[tuple[HttpResponse, Any]] = []

        def call(_request: HttpRequest) -> HttpResponse:
            result = next_(source, info, **self.resolver_arguments(kwargs))
            ran.append((self.as_response(result), result))
            return ran[0][0]

        view = getattr(request.resolver_match, "func", None)
        block = view_transaction_of(view or call)
        return self.answer(run(request, options, call, block, begin_phase), ran)

    async def resolve_async(
        self, next_: Callable[..., Any], source: Any, info: Info, **kwargs: Any
    ) -> Any:
        request, options, begin_phase = self.prepare(info, kwargs)
        ran: list[tuple[HttpResponse, Any]] = []

        async def call(_request: HttpRequest) -> HttpResponse:
            result = await next_(source, info, **self.resolver_arguments(kwargs))
            ran.append((await sync_to_async(self.as_response)(result), result))
            return ran[0][0]

        return self.answer(await arun(request, options, call, begin_phase), ran)

    def prepare(self, info: Info, kwargs: dict[str, Any]) -> tuple[HttpRequest, ViewOptions, Any]:
        """The Django request, the options with this call's fingerprint, phase 1 with its key."""
        context = info.context
        request = context.get("request") if isinstance(context, dict) else context.request
        if not isinstance(request, HttpRequest):
            raise TypeError(
                "idempotency_django.graphql needs the Django request in info.context.request: "
                "serve the schema with strawberry.django.views.GraphQLView (or its async view)."
            )
        given = kwargs.get(KEY_ARGUMENT)
        arguments = {name: value for name, value in kwargs.items() if name != KEY_ARGUMENT}
        fingerprint = _fingerprint(info._raw_info.parent_type.name, info.field_name, arguments)
        options = dataclasses.replace(self.options, fingerprint=lambda _request: fingerprint)
        if given is not None:
            read = functools.partial(_given, given)
            return request, options, functools.partial(begin, read_key=read)
        if _protected_fields(info) == 1:
            return request, options, begin  # the key may be in the header
        return request, options, functools.partial(begin, read_key=_no_key)

    def as_response(self, result: Any) -> HttpResponse:
        """The resolver's result as the answer the protocol keeps (a 200 of its JSON),
        read through the field's declared type: a model instance under a
        strawberry-django type is kept as that type's fields."""
        assert self.field is not None
        try:
            body = _json(_kept(self.field.type, result))
        except (TypeError, ValueError, RecursionError) as exc:
            # Raised in the attempt: its key is given back, its savepoint rolled back.
            raise TypeError(
                f"An idempotent mutation returned {type(result).__name__}, which cannot be "
                "kept for its retries: return what the field's type declares, with fields "
                "that are JSON, enums, dates, decimals or UUIDs."
            ) from exc
        return HttpResponse(body, content_type="application/json")

    def resolver_arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.adds_argument:
            return {name: value for name, value in kwargs.items() if name != KEY_ARGUMENT}
        return kwargs

    def answer(self, response: HttpResponseBase, ran: list[tuple[HttpResponse, Any]]) -> Any:
        """The field's value: the resolver's result, a replay of it, or the refusal raised."""
        if ran and response is ran[0][0]:
            return ran[0][1]
        problem = getattr(response, PROBLEM_ATTRIBUTE, None)
        if problem is not None:
            members, retry_after = problem
            extensions: dict[str, Any] = {"code": members["code"]}
            if retry_after is not None:
                extensions["retryAfter"] = retry_after
            raise GraphQLError(str(members["detail"]), extensions=extensions)
        assert isinstance(response, HttpResponse) and self.field is not None
        return _rebuilt(self.field.type, json.loads(response.content))


def _given(key: str, _request: HttpRequest) -> str:
    return key


def _no_key(_request: HttpRequest) -> None:
    return None


def _in_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# -- the header's key: one protected mutation in the request ------------------------


def _protected_fields(info: Info) -> int:
    """The protected fields among the operation's root fields (aliases counted apart)."""
    raw = info._raw_info  # graphql-core's: the parent type's fields, the fragments
    fields = raw.parent_type.fields
    count = 0
    for node in _root_fields(raw.operation.selection_set, raw.fragments, set()):
        field = fields.get(node.name.value)
        definition = field.extensions.get(_DEFINITION) if field is not None else None
        extensions = getattr(definition, "extensions", ())
        count += any(isinstance(extension, Idempotent) for extension in extensions)
    return count


def _root_fields(
    selections: SelectionSetNode, fragments: dict[str, Any], seen: set[str]
) -> Iterator[FieldNode]:
    for node in selections.selections:
        if isinstance(node, FieldNode):
            yield node
        elif isinstance(node, InlineFragmentNode):
            yield from _root_fields(node.selection_set, fragments, seen)
        elif isinstance(node, FragmentSpreadNode) and node.name.value not in seen:
            seen.add(node.name.value)
            fragment = fragments.get(node.name.value)
            if fragment is not None:
                yield from _root_fields(fragment.selection_set, fragments, seen)


# -- the fingerprint and the stored result ------------------------------------------


def _plain(value: Any) -> Any:
    """What ``json`` cannot write itself: Strawberry types and inputs, enums, dates, ..."""
    definition = get_object_definition(type(value))
    if definition is not None:
        # A field with a resolver of its own is computed again from these on a replay.
        names = [field.python_name for field in definition.fields if field.base_resolver is None]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [field.name for field in dataclasses.fields(value)]
    else:
        names = None
    if names is not None:
        values = {name: getattr(value, name) for name in names}
        return {name: item for name, item in values.items() if not isinstance(item, UnsetType)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, UnsetType):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON")


def _json(value: Any) -> str:
    return json.dumps(value, default=_plain, sort_keys=True, separators=(",", ":"))


def _fingerprint(parent: str, field: str, arguments: dict[str, Any]) -> str:
    """Keyed as a request's is; an omitted argument is told apart from an explicit null."""
    present = {name: value for name, value in arguments.items() if not isinstance(value, UnsetType)}
    canonical = _json(["graphql", parent, field, present]).encode()
    return keyed_digest(lambda: [canonical])


def _kept(kind: Any, value: Any) -> Any:
    """``value`` as the field's type ``kind`` shows it: a Strawberry (or strawberry-django)
    type's fields without a resolver of their own, read by name (a model's attributes)."""
    if value is None:
        return None
    if isinstance(kind, StrawberryOptional):
        return _kept(kind.of_type, value)
    if isinstance(kind, StrawberryList):
        return [_kept(kind.of_type, item) for item in value]
    definition = get_object_definition(kind)
    if definition is None:
        return value  # a scalar or an enum: _json writes it
    return {
        field.python_name: _kept(field.type, getattr(value, _attribute(field)))
        for field in definition.fields
        if field.base_resolver is None
    }


def _attribute(field: StrawberryField) -> str:
    """Where a type's field reads its value: a strawberry-django field's model attribute."""
    return str(getattr(field, "django_name", None) or field.python_name)


#: Scalars stored as text, read back for their Strawberry scalar.
_PARSERS: dict[Any, Callable[[Any], Any]] = {
    datetime.datetime: datetime.datetime.fromisoformat,
    datetime.date: datetime.date.fromisoformat,
    datetime.time: datetime.time.fromisoformat,
    decimal.Decimal: decimal.Decimal,
    uuid.UUID: uuid.UUID,
}


def _rebuilt(kind: Any, data: Any) -> Any:
    """The stored JSON as a value of the field's declared type (for a replay)."""
    if data is None:
        return None
    if isinstance(kind, StrawberryOptional):
        return _rebuilt(kind.of_type, data)
    if isinstance(kind, StrawberryList):
        return [_rebuilt(kind.of_type, item) for item in data]
    definition = get_object_definition(kind)
    if definition is not None:
        values = {
            field.python_name: _rebuilt(field.type, data[field.python_name])
            for field in definition.fields
            if field.base_resolver is None and field.init and field.python_name in data
        }
        return kind(**values)
    wrapped = getattr(kind, "wrapped_cls", kind)  # an enum's definition wraps its class
    if isinstance(wrapped, type) and issubclass(wrapped, enum.Enum):
        return wrapped(data)
    parse = _PARSERS.get(kind)
    return parse(data) if parse is not None else data
