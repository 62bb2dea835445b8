"""Strawberry GraphQL: a mutation field that runs once per key, replayed after.

One marker on the field, a Strawberry field extension::

    from idempotency_django.graphql import Idempotent

    @strawberry.type
    class Mutation:
        @strawberry.mutation(extensions=[Idempotent()])
        def create_order(self, info: strawberry.Info, item: str) -> Order: ...

The field gains an ``idempotencyKey: String`` argument; a request with exactly one
protected mutation (not a batch of operations) may send the key in the ``Idempotency-Key``
header instead. The key
goes through the protocol every door does (``phases.run`` and ``arun``), refused with the
REST answers' codes in a ``GraphQLError``'s ``extensions.code``. docs/graphql.md says why
an extension and what counts as the same request. Nothing else in the package imports
Strawberry (``pip install idempotency-django[graphql]``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import functools
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.files import File
from django.http import HttpRequest, HttpResponse, RawPostDataException
from django.http.response import HttpResponseBase
from graphql import FieldNode, FragmentSpreadNode, GraphQLError, InlineFragmentNode
from graphql.language import SelectionSetNode
from strawberry.annotation import StrawberryAnnotation
from strawberry.extensions import FieldExtension
from strawberry.types import Info
from strawberry.types.arguments import StrawberryArgument
from strawberry.types.base import StrawberryList, StrawberryOptional, get_object_definition
from strawberry.types.field import StrawberryField
from strawberry.types.unset import UNSET, UnsetType

try:  # strawberry.Maybe, from Strawberry 0.266.1; the package admits 0.240 and later
    from strawberry.types.maybe import Some
except ImportError:  # pragma: no cover - an older Strawberry: no argument is a Some
    Some = None  # type: ignore[assignment,misc]

from idempotency_django.protocol.fingerprint import keyed_digest
from idempotency_django.protocol.marks import forget_claim
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
#: In a kept result's object: its fields the resolver left UNSET.
_UNSET_FIELDS = "__unset"
#: A batched request's JSON: a list of operations (matched at its start, never copied).
_LIST_START = re.compile(rb"\s*\[")


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
        self.key_argument: StrawberryArgument | None = None  # the one apply added

    def apply(self, field: StrawberryField) -> None:
        # Called again each time a schema is built over the field's type (a Mutation type
        # served by two schemas): the argument added the first time is not the resolver's.
        self.field = field
        if any(argument is self.key_argument for argument in field.arguments):
            return
        if any(argument.python_name == KEY_ARGUMENT for argument in field.arguments):
            self.adds_argument = False  # the resolver takes the key itself
            return
        if self.key_argument is None:
            self.key_argument = StrawberryArgument(
                python_name=KEY_ARGUMENT,
                graphql_name=None,
                type_annotation=StrawberryAnnotation(str | None),
                default=None,
                description="Runs this mutation at most once per key; a retry gets its result.",
            )
        field.arguments = [*field.arguments, self.key_argument]

    # -- resolving --

    def resolve(self, next_: Callable[..., Any], source: Any, info: Info, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a sync view
            return self.resolve_sync(next_, source, info, kwargs)
        # A sync resolver under an async view: its and the store's blocking I/O stay off the loop.
        return sync_to_async(self.resolve_sync)(next_, source, info, kwargs)

    def resolve_sync(
        self, next_: Callable[..., Any], source: Any, info: Info, kwargs: dict[str, Any]
    ) -> Any:
        request, options, begin_phase, arguments = self.prepare(info, kwargs)
        ran: list[tuple[HttpResponse, Any]] = []

        def call(_request: HttpRequest) -> HttpResponse:
            result = next_(source, info, **arguments)
            ran.append((self.as_response(result), result))
            return ran[0][0]

        view = getattr(request.resolver_match, "func", None)
        block = view_transaction_of(view or call)
        try:
            return self.answer(run(request, options, call, block, begin_phase), ran)
        finally:
            forget_claim(request)  # the next mutation's downstream_key is not this one's

    async def resolve_async(
        self, next_: Callable[..., Any], source: Any, info: Info, **kwargs: Any
    ) -> Any:
        request, options, begin_phase, arguments = self.prepare(info, kwargs)
        ran: list[tuple[HttpResponse, Any]] = []

        async def call(_request: HttpRequest) -> HttpResponse:
            result = await next_(source, info, **arguments)
            ran.append((await sync_to_async(self.as_response)(result), result))
            return ran[0][0]

        try:
            return self.answer(await arun(request, options, call, begin_phase), ran)
        finally:
            forget_claim(request)

    def prepare(
        self, info: Info, kwargs: dict[str, Any]
    ) -> tuple[HttpRequest, ViewOptions, Any, dict[str, Any]]:
        """The Django request, the options with this call's fingerprint, phase 1 with its key,
        the resolver's arguments."""
        context = info.context
        if isinstance(context, dict):
            request = context.get("request")
        else:
            request = getattr(context, "request", None)  # None: no context at all
        if not isinstance(request, HttpRequest):
            raise TypeError(
                "idempotency_django.graphql needs the Django request in info.context.request: "
                "serve the schema with strawberry.django.views.GraphQLView (or its async view)."
            )
        given = kwargs.get(KEY_ARGUMENT)
        arguments = {name: value for name, value in kwargs.items() if name != KEY_ARGUMENT}
        parent, field = info._raw_info.parent_type.name, info.field_name
        # Made when phase 1 needs it: a call without a key reads no argument's bytes.
        options = dataclasses.replace(
            self.options, fingerprint=lambda _request: _fingerprint(parent, field, arguments)
        )
        phase: Any = functools.partial(begin, read_key=lambda _request: given)
        if given is None and _protected_fields(info) == 1 and not _batched(info, request):
            phase = begin  # the key may be in the header
        return request, options, phase, arguments if self.adds_argument else kwargs

    def as_response(self, result: Any) -> HttpResponse:
        """The resolver's result as the answer the protocol keeps (a 200 of its JSON),
        read through the field's declared type: a model instance under a
        strawberry-django type is kept as that type's fields."""
        assert self.field is not None
        try:
            body = _json(_through(self.field.type, result, keep=True))
        except (TypeError, ValueError, RecursionError) as exc:
            # Raised in the attempt: its key is given back, its savepoint rolled back.
            raise TypeError(
                f"An idempotent mutation returned {type(result).__name__}, which cannot be "
                "kept for its retries: return what the field's type declares, with fields "
                "that are JSON, enums, dates, decimals or UUIDs."
            ) from exc
        return HttpResponse(body, content_type="application/json")

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
        return _through(self.field.type, json.loads(response.content), keep=False)


# -- the header's key: one protected mutation in the request ------------------------


def _batched(info: Info, request: HttpRequest) -> bool:
    """Whether the request is a batch of operations (Strawberry's batching: a JSON list,
    as the body or as a multipart request's ``operations``), each run apart: the header
    cannot say which of their mutations it keys. A Strawberry without batching, or a
    schema without its ``batching_config``, refuses a list."""
    if getattr(info.schema.config, "batching_config", None) is None:
        return False
    if request.content_type == "multipart/form-data":  # the files are apart: a short text
        body = request.POST.get("operations", "").encode()
    else:
        try:
            body = request.body  # read, and kept, by the view
        except RawPostDataException:  # pragma: no cover - read as a form: not JSON
            return False
    return _LIST_START.match(body) is not None


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
    if Some is not None and isinstance(value, Some):  # Maybe: a value, or null, given
        return {"some": value.value}
    raise TypeError(f"{type(value).__name__} is not JSON")


def _json(value: Any, plain: Callable[[Any], Any] = _plain) -> str:
    return json.dumps(value, default=plain, sort_keys=True, separators=(",", ":"))


def _fingerprint(parent: str, field: str, arguments: dict[str, Any]) -> str:
    """Keyed as a request's is; an omitted argument is told apart from an explicit null."""
    present = {name: value for name, value in arguments.items() if not isinstance(value, UnsetType)}
    canonical = _json(["graphql", parent, field, present], _argument).encode()
    return keyed_digest([canonical])


def _argument(value: Any) -> Any:
    """An argument as the fingerprint counts it: bytes (``Base64``) and uploaded files by
    the SHA-256 of their content, never kept; anything else as :func:`_plain` writes it."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if isinstance(value, File):
        digest = hashlib.sha256()
        for chunk in value.chunks():  # from its start
            digest.update(chunk)
        value.seek(0)  # for the resolver
        content_type = getattr(value, "content_type", None)
        return {"file": value.name, "content_type": content_type, "sha256": digest.hexdigest()}
    return _plain(value)


def _through(kind: Any, value: Any, *, keep: bool) -> Any:
    """``value`` walked through the field's declared type ``kind``: the resolver's result as
    the JSON kept (``keep``), or that JSON as the declared type again (a replay). A type is
    its fields without a resolver of their own (computed again on a replay), read by name: a
    strawberry-django type's from its model's attributes."""
    if value is None:
        return None
    if isinstance(kind, StrawberryOptional):
        return _through(kind.of_type, value, keep=keep)
    if isinstance(kind, StrawberryList):
        return [_through(kind.of_type, item, keep=keep) for item in value]
    definition = get_object_definition(kind)
    if definition is not None:
        fields = {
            field.python_name: field for field in definition.fields if field.base_resolver is None
        }
        if keep:
            read = {
                name: getattr(value, getattr(field, "django_name", None) or name)
                for name, field in fields.items()
            }
            unset = [name for name, item in read.items() if isinstance(item, UnsetType)]
            kept = {
                name: _through(fields[name].type, item, keep=True)
                for name, item in read.items()
                if name not in unset
            }
            # Named apart ("__" is GraphQL's own prefix): UNSET again on a replay, so that
            # Strawberry answers the field as it answered the first call.
            return {**kept, _UNSET_FIELDS: unset} if unset else kept
        unset = value.get(_UNSET_FIELDS, ())
        rebuilt = {
            name: UNSET if name in unset else _through(field.type, value[name], keep=False)
            for name, field in fields.items()
            if field.init and (name in value or name in unset)
        }
        return kind(**rebuilt)
    if keep:
        if dataclasses.is_dataclass(value) and get_object_definition(type(value)) is None:
            # A dataclass under a scalar of its own: a replay could not give the scalar
            # its object again, only the fields' JSON.
            raise TypeError(f"{type(value).__name__} is not JSON")
        return value  # a scalar or an enum: _json writes it
    wrapped = getattr(kind, "wrapped_cls", kind)  # an enum's definition wraps its class
    if isinstance(wrapped, type) and issubclass(wrapped, enum.Enum):
        return wrapped(value)
    if kind in (datetime.datetime, datetime.date, datetime.time):  # kept as text (_plain)
        return kind.fromisoformat(value)
    return kind(value) if kind in (decimal.Decimal, uuid.UUID) else value
