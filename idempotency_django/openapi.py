"""OpenAPI documentation of the key contract through drf-spectacular (docs/openapi.md)::

    REST_FRAMEWORK = {
        "DEFAULT_SCHEMA_CLASS": "idempotency_django.openapi.IdempotentAutoSchema",
    }

Every protected operation whose method is in ``IDEMPOTENCY["METHODS"]`` then documents
the ``Idempotency-Key`` header, the replay header on its success responses and the
problem answers. Nothing else in the package imports this module or drf-spectacular.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent, get_doc
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.utils import OpenApiParameter

from idempotency_django.conf import idempotency_settings
from idempotency_django.drf import IdempotentMixin
from idempotency_django.protocol.marks import EXEMPT_ATTRIBUTE, OPTIONS_ATTRIBUTE
from idempotency_django.protocol.openapi_contract import (
    KEY_SCHEMA,
    PROBLEM_SCHEMA,
    ProblemAnswer,
    add_problem_response,
    add_replayed_header,
    key_description,
    key_required,
    problem_answers,
)
from idempotency_django.protocol.options import ViewOptions

__all__ = ["PROBLEM_COMPONENT_NAME", "IdempotentAutoSchema", "view_idempotency_options"]

#: Name of the problem-details schema in ``components.schemas``.
PROBLEM_COMPONENT_NAME = "IdempotencyProblem"


def view_idempotency_options(view: Any, method: str) -> ViewOptions | None:
    """The options the handler serving ``method`` on this DRF view instance (a viewset's
    with its ``action`` set) runs with; None when it is not protected."""
    if method.upper() not in idempotency_settings.METHODS:
        return None
    action = getattr(view, "action", None)
    handler = getattr(view, action if isinstance(action, str) and action else method.lower(), None)
    if handler is None:
        return None
    if isinstance(view, IdempotentMixin):
        return view.idempotency_options_of(handler)  # what its ``initial`` reads
    func = getattr(handler, "__func__", handler)
    if getattr(func, EXEMPT_ATTRIBUTE, False):
        return None
    # @api_view installs ``def handler(self, *args, **kwargs): return func(...)`` on a
    # generated APIView: the protected function is in its closure.
    for candidate in (func, *_closure(func)):
        options = getattr(candidate, OPTIONS_ATTRIBUTE, None)
        if isinstance(options, ViewOptions) and not getattr(candidate, EXEMPT_ATTRIBUTE, False):
            return options
    return None


def _closure(func: Any) -> Iterator[Any]:
    for cell in getattr(func, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            if callable(cell.cell_contents):
                yield cell.cell_contents


class IdempotentAutoSchema(AutoSchema):
    """drf-spectacular's ``AutoSchema`` that also documents the Idempotency-Key contract.

    Subclass it to change the texts, or to combine it with another
    ``AutoSchema`` subclass (put this one first). ``@extend_schema`` keeps
    working: its parameters and responses take precedence over the ones
    added here.
    """

    def idempotency_options(self) -> ViewOptions | None:
        """The protection options of the current operation, or None if unprotected."""
        return view_idempotency_options(self.view, self.method)

    def get_description(self) -> str:  # type: ignore[override]
        description: str = super().get_description()
        if not description or description != get_doc(IdempotentMixin):
            return description
        # drf-spectacular takes the first docstring along the view's MRO, which is
        # IdempotentMixin's when the view has none of its own: skip it.
        excludes = spectacular_settings.GET_LIB_DOC_EXCLUDES()
        for klass in type(self.view).__mro__:
            if klass in excludes:
                break
            if klass is not IdempotentMixin and klass.__doc__:
                return get_doc(klass)
        return ""

    def get_override_parameters(self) -> list[Any]:
        parameters: list[Any] = list(super().get_override_parameters())
        options = self.idempotency_options()
        if options is None:
            return parameters
        header = OpenApiParameter(
            name=idempotency_settings.HEADER,
            type=dict(KEY_SCHEMA),
            location=OpenApiParameter.HEADER,
            required=key_required(options.required),
            description=self.idempotency_key_description(options),
        )
        # Ours first: a parameter of the same name from @extend_schema replaces it.
        return [header, *parameters]

    def idempotency_key_description(self, options: ViewOptions) -> str:
        return key_description(key_required(options.required), options.fingerprint)

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        options = self.idempotency_options()
        if operation is not None and options is not None:
            self.add_idempotency_responses(operation.setdefault("responses", {}), options)
        return operation

    def add_idempotency_responses(self, responses: dict[str, Any], options: ViewOptions) -> None:
        """Add the replay header to 2xx responses and the problem responses."""
        for code, response in responses.items():
            if str(code).startswith("2") and isinstance(response, dict):
                add_replayed_header(response)
        for answer in self.idempotency_problems(options):
            response = responses.get(str(answer[0]))
            if not isinstance(response, dict):
                response = responses[str(answer[0])] = {}
            response["description"] = response.get("description") or answer[1]
            add_problem_response(response, answer, self._problem_ref())

    def idempotency_problems(self, options: ViewOptions) -> list[ProblemAnswer]:
        """(status, description, [(code, detail)], headers) for each problem response."""
        return problem_answers(key_required(options.required))

    def _problem_ref(self) -> dict[str, Any]:
        component = ResolvedComponent(  # type: ignore[no-untyped-call]
            name=PROBLEM_COMPONENT_NAME,
            type=ResolvedComponent.SCHEMA,
            schema=copy.deepcopy(PROBLEM_SCHEMA),
            object=PROBLEM_COMPONENT_NAME,
        )
        self.registry.register_on_missing(component)
        ref: dict[str, Any] = component.ref
        return ref
