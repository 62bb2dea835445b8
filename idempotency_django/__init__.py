"""Idempotency-Key support for Django and Django REST framework.

Where a request goes:

* :mod:`idempotency_django.middleware` protects plain Django views: it
  claims the key before ``get_response`` and stores the answer after;
* :func:`idempotency_django.decorators.idempotent` protects one view, a
  class-based view, or a DRF view/viewset (:mod:`idempotency_django.drf`);
* :func:`idempotency_django.webhooks.deduplicate_webhook` accepts each
  webhook delivery once;
* all of them run the two phases of :mod:`idempotency_django.protocol.phases`:
  ``begin(request)`` answers a replay or a conflict, or returns an attempt
  that owns the key; ``attempt.finish(response)`` stores the answer (or
  ``attempt.abort()`` releases the key). The state lives in the configured
  store (:mod:`idempotency_django.stores`);
* a protected view names the calls it makes to other ``Idempotency-Key``
  APIs with :func:`idempotency_django.downstream.downstream_key`;
* every refusal is a row of :data:`idempotency_django.protocol.problems.REFUSALS`,
  every decision one line of :mod:`idempotency_django.protocol.logs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: The one place the version is written (pyproject.toml reads it). A ``.dev0``
#: version is unreleased: the changelog's "Unreleased" section is what it will be.
__version__ = "0.3.0.dev0"

__all__ = [
    "ViewOptions",
    "__version__",
    "downstream_key",
    "idempotency_exempt",
    "idempotent",
    "lookup",
]

if TYPE_CHECKING:  # the names' own types, where a run imports them lazily
    from idempotency_django.decorators import idempotency_exempt, idempotent
    from idempotency_django.downstream import downstream_key
    from idempotency_django.protocol.options import ViewOptions
    from idempotency_django.state import lookup
else:

    def __getattr__(name: str) -> Any:
        # Lazy, so importing the package (e.g. from settings) loads no models.
        if name in ("idempotent", "idempotency_exempt"):
            from idempotency_django import decorators

            return getattr(decorators, name)
        if name == "lookup":
            from idempotency_django.state import lookup

            return lookup
        if name == "downstream_key":
            from idempotency_django.downstream import downstream_key

            return downstream_key
        if name == "ViewOptions":
            from idempotency_django.protocol.options import ViewOptions

            return ViewOptions
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
