"""OpenAPI documentation of the key contract through drf-spectacular.

Enable it once, in settings::

    REST_FRAMEWORK = {
        "DEFAULT_SCHEMA_CLASS": "idempotency_django.openapi.IdempotentAutoSchema",
    }

Every operation whose handler is protected (``@idempotent`` on the view,
viewset or action, below ``@api_view``, or ``IdempotentMixin``) and whose
method is in ``IDEMPOTENCY["METHODS"]`` then documents the
``Idempotency-Key`` request header, the ``Idempotency-Replayed`` header on
its success responses, and the problem responses the key contract can
answer. Exempt handlers and unprotected views are left as they are.

This module imports drf-spectacular; nothing else in the package imports
this module, so drf-spectacular stays optional.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent, get_doc
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
    key_description,
    key_required,
    problem_answers,
    replayed_header,
    same_request_description,
)
from idempotency_django.protocol.options import ViewOptions

__all__ = ["PROBLEM_COMPONENT_NAME", "IdempotentAutoSchema", "view_idempotency_options"]

#: Name of the problem-details schema in ``components.schemas``.
PROBLEM_COMPONENT_NAME = "IdempotencyProblem"


def view_idempotency_options(view: Any, method: str) -> ViewOptions | None:
    """The options the handler serving ``method`` on this DRF view runs with.

    None when that handler is not protected, is exempt, or ``method`` is not
    one the key protects. ``view`` is a view instance as drf-spectacular
    builds it (a viewset instance has ``action`` set).
    """
    if method.upper() not in idempotency_settings.METHODS:
        return None
    action = getattr(view, "action", None)
    name = action if isinstance(action, str) and action else method.lower()
    handler = getattr(view, name, None)
    if handler is None:
        return None
    if isinstance(view, IdempotentMixin):
        return view.idempotency_options_of(handler)  # what its ``initial`` reads
    return _handler_options(handler)


def _handler_options(handler: Any) -> ViewOptions | None:
    func = getattr(handler, "__func__", handler)
    if getattr(func, EXEMPT_ATTRIBUTE, False):
        return None
    options = getattr(func, OPTIONS_ATTRIBUTE, None)
    if isinstance(options, ViewOptions):
        return options
    # @api_view installs ``def handler(self, *args, **kwargs): return func(...)``
    # on a generated APIView: the protected function is in its closure.
    for cell in getattr(func, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(inner) and not getattr(inner, EXEMPT_ATTRIBUTE, False):
            options = getattr(inner, OPTIONS_ATTRIBUTE, None)
            if isinstance(options, ViewOptions):
                return options
    return None


def _class_doc(cls: type, *, skip: type) -> str:
    excludes = spectacular_settings.GET_LIB_DOC_EXCLUDES()
    for klass in cls.__mro__:
        if klass in excludes:
            break
        if klass is not skip and klass.__doc__:
            return "\n".join(line.rstrip() for line in inspect.cleandoc(klass.__doc__).split("\n"))
    return ""


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

    def idempotency_key_required(self, options: ViewOptions) -> bool:
        return key_required(options.required)

    def get_description(self) -> str:  # type: ignore[override]
        description: str = super().get_description()
        if description and description == get_doc(IdempotentMixin):
            # drf-spectacular takes the first docstring along the view's MRO,
            # which is IdempotentMixin's when the view has none of its own.
            return _class_doc(type(self.view), skip=IdempotentMixin)
        return description

    def get_override_parameters(self) -> list[Any]:
        parameters: list[Any] = list(super().get_override_parameters())
        options = self.idempotency_options()
        if options is None:
            return parameters
        header = OpenApiParameter(
            name=idempotency_settings.HEADER,
            type=dict(KEY_SCHEMA),
            location=OpenApiParameter.HEADER,
            required=self.idempotency_key_required(options),
            description=self.idempotency_key_description(options),
        )
        # Ours first: a parameter of the same name from @extend_schema replaces it.
        return [header, *parameters]

    def idempotency_key_description(self, options: ViewOptions) -> str:
        return key_description(
            self.idempotency_key_required(options), self.same_request_description(options)
        )

    def same_request_description(self, options: ViewOptions) -> str:
        """Which parts of a request make a retry "the same request" on this endpoint."""
        return same_request_description(options.fingerprint)

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        options = self.idempotency_options()
        if options is not None:
            self.add_idempotency_responses(operation.setdefault("responses", {}), options)
        return operation

    def add_idempotency_responses(self, responses: dict[str, Any], options: ViewOptions) -> None:
        """Add the replay header to 2xx responses and the problem responses."""
        for code, response in responses.items():
            if str(code).startswith("2") and isinstance(response, dict):
                response.setdefault("headers", {}).setdefault(
                    idempotency_settings.MARKER_HEADERS.replayed, replayed_header()
                )
        for answer in self.idempotency_problems(options):
            response = responses.get(str(answer[0]))
            if not isinstance(response, dict):
                response = responses[str(answer[0])] = {}
            response["description"] = response.get("description") or answer[1]
            add_problem_response(response, answer, self._problem_ref())

    def idempotency_problems(self, options: ViewOptions) -> list[ProblemAnswer]:
        """(status, description, [(code, detail)], headers) for each problem response."""
        return problem_answers(self.idempotency_key_required(options))

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
