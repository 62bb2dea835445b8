"""Protects plain Django views. DRF views are left to the DRF integration.

The middleware never calls the view. For a keyed unsafe request it claims
the key before ``get_response`` and stores (or releases) after it, so every
other middleware (CSRF, ``LoginRequiredMiddleware``, exception and template
response hooks) runs exactly as it does for a request without a key, and
the response it stores is the one they made.

Place it after ``AuthenticationMiddleware``: keys are scoped by
``request.user``. Where the view runs in a transaction (``ATOMIC_REQUESTS``
on its database, or ``IDEMPOTENCY["ATOMIC"]``), the middleware opens that
transaction itself, around the claim, ``get_response`` and the completion;
the view's own ``ATOMIC_REQUESTS`` block becomes a savepoint inside it. So
the stored response commits with the view's writes (database store), or the
reservation is checked before they commit (other stores).

Under ASGI a sync view is protected the same way, on one worker thread; an
async view through :func:`~idempotency_django.protocol.phases.arun`. Either runs to
its end when the client hangs up (:func:`~idempotency_django.protocol.phases.run_to_the_end`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import ResolverMatch

from idempotency_django.conf import idempotency_settings
from idempotency_django.protocol.bodies import ready_body
from idempotency_django.protocol.marks import (
    ACTIVE_ATTRIBUTE,
    DECISION_ATTRIBUTE,
    DRF_LEFT_ALONE,
    DRF_PROTECTED,
    EXEMPT_ATTRIBUTE,
    PROTECTED_ATTRIBUTE,
    RECEIVER_ATTRIBUTE,
    drf_protection,
    key_header,
    ninja_protection,
    note_handled_exception,
)
from idempotency_django.protocol.options import ViewOptions
from idempotency_django.protocol.phases import (
    arun,
    mark_ignored_key,
    run,
    run_to_the_end,
)
from idempotency_django.protocol.problems import refuse
from idempotency_django.protocol.routes import match_of
from idempotency_django.protocol.transactions import (
    roll_back_view,
    view_savepoint,
    view_transaction_of,
)
from idempotency_django.tasks import TaskInProgress, TaskKeyReused

#: Views of these modules never need a key, whatever REQUIRED_PATHS says.
NEVER_REQUIRED_MODULES = ("django.contrib.admin.", "django.contrib.auth.")
#: The options of a plain view: whether its path needs a key, the settings for the rest.
KEY_REQUIRED, KEY_OPTIONAL = ViewOptions(required=True), ViewOptions(required=False)


class IdempotencyMiddleware:
    """Protects the plain Django views of every keyed unsafe request; sync and async.

    Add it to ``MIDDLEWARE`` after ``AuthenticationMiddleware``. It claims the
    key before ``get_response`` and stores (or releases) the answer after it:
    a replay or a conflict is answered without calling ``get_response``.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        keyed, match, protected, elsewhere = examine(request)
        guarded = keyed and (protected is not None or elsewhere is not None)
        if guarded and (refused := ready_body(request, match)) is not None:
            return refused.refusal(request)  # before any CSRF check or parser reads the body
        if protected is None:
            response = self.get_response(request)
        else:
            view, options = protected
            block = view_transaction_of(view)
            response = run(request, options, in_a_block_of_its_own(self.get_response, view), block)
        if (
            keyed
            and elsewhere != DRF_PROTECTED
            and getattr(request, DECISION_ATTRIBUTE, None) != "protected"
        ):
            mark_ignored_key(request, response)  # a key nobody used: say so
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        keyed, match, protected, elsewhere = examine(request)
        if keyed and (protected is not None or elsewhere is not None):
            refused = await sync_to_async(ready_body)(request, match)
            if refused is not None:
                return await sync_to_async(refused.refusal)(request)
        response = await self.protected_response(request, protected, match)
        if (
            keyed
            and elsewhere != DRF_PROTECTED
            and getattr(request, DECISION_ATTRIBUTE, None) != "protected"
        ):
            mark_ignored_key(request, response)
        return response

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        """What a protected view raised rolls back its work; a task the view ran
        in-process that refused its key is a 409 problem, never a 500.

        Django calls it for what a view raised (``Http404``, ``PermissionDenied``,
        which it then answers), after an ``ATOMIC_REQUESTS`` block of the view
        rolled back. Under ``IDEMPOTENCY["ATOMIC"]`` the view's own savepoint
        does the same (:func:`in_a_block_of_its_own`): its writes go, the claim before them
        stays, so a retain function may still keep its 4xx. Nothing else is rolled
        back: a transaction a project's middleware opened is not this one's.
        """
        if getattr(request, ACTIVE_ATTRIBUTE, False):
            savepoint = request.__dict__.pop(VIEW_SAVEPOINT_ATTRIBUTE, None)
            if savepoint is not None:
                roll_back_view(savepoint)
            note_handled_exception(request, exception)  # for a retain function
        if isinstance(exception, TaskKeyReused | TaskInProgress):
            return refuse(request, exception.code)
        return None

    async def protected_response(
        self, request: HttpRequest, protected: Protected | None, match: ResolverMatch | None
    ) -> HttpResponseBase:
        if protected is None:
            if runs_in_a_thread(request, match):
                # Django runs a sync view in a thread, which a hang-up cannot stop; but
                # its cancellation reaches the view's async_to_sync calls (a signal's
                # async receiver, Channels' group_send), and a door inside the view
                # (@idempotent, DRF, ninja, a webhook receiver) would keep a key over
                # half-done work. Its thread runs to the end instead, as under WSGI.
                return await run_to_the_end(self.get_response(request))
            response: HttpResponseBase = await self.get_response(request)
            return response
        view, options = protected
        if iscoroutinefunction(view):
            return await arun(request, options, self.get_response)
        # A sync view runs on one thread, as under WSGI: the claim, the view
        # (Django sends it back to this thread) and the completion share one
        # transaction. Run to the end even if the client hangs up.
        get_response = in_a_block_of_its_own(async_to_sync(self.get_response), view)
        block = view_transaction_of(view)
        protected_call = sync_to_async(run)(request, options, get_response, block)
        return await run_to_the_end(protected_call)


#: On a request whose view runs under a savepoint of its own: its alias and id.
VIEW_SAVEPOINT_ATTRIBUTE = "_idempotency_view_savepoint"


def in_a_block_of_its_own(
    get_response: Callable[[HttpRequest], Any], view: Callable[..., Any]
) -> Callable[[HttpRequest], Any]:
    """``get_response``, under ``IDEMPOTENCY["ATOMIC"]`` in a savepoint of its own in the
    transaction opened around it (after the claim), as ``ATOMIC_REQUESTS`` gives a view
    its own block: :meth:`IdempotencyMiddleware.process_exception` rolls back to it."""

    def respond(request: HttpRequest) -> Any:
        savepoint = view_savepoint(view)
        if savepoint is not None:
            setattr(request, VIEW_SAVEPOINT_ATTRIBUTE, savepoint)
        return get_response(request)

    return respond


#: The view the middleware protects, with its options.
Protected = tuple[Callable[..., Any], ViewOptions]


def examine(
    request: HttpRequest,
) -> tuple[bool, ResolverMatch | None, Protected | None, str | None]:
    """What the middleware does with ``request``, looked at once and handed on.

    Whether it is keyed (unsafe, with a key); its URL match, resolved here for a
    request that may be protected (keyed, or unsafe under ``REQUIRED_PATHS``; None
    for any other and for a URL that resolves to nothing); the view this
    middleware protects, with its options (None for a request without a key,
    unless its path matches ``REQUIRED_PATHS``, and for the views below); and
    whether the view is protected elsewhere: ``DRF_PROTECTED`` for a DRF view the
    library protects, a ninja operation under ``idempotency_django.ninja``, a view
    or a class-based view's handler under ``@idempotent``, which decide about the
    key themselves, the body ready for them; ``DRF_UNMARKED`` for a DRF view that
    may be (``@idempotent`` on a method its handler calls), whose body is readied
    and whose key is marked as not used unless its claim says otherwise; None for
    the rest. A view or handler under ``@idempotency_exempt``, a webhook
    receiver (it readies its own body, uncapped), a method DRF answers 405, and a
    ninja operation the integration does not protect (ninja authenticates inside
    its view) are left alone.
    """
    settings = idempotency_settings
    unsafe = request.method in settings.METHODS
    keyed = unsafe and key_header(request, settings.HEADER) is not None
    if not keyed and not (unsafe and settings.ENABLED and settings.REQUIRED_PATHS):
        return keyed, None, None, None
    match = match_of(request)
    if match is None or not settings.ENABLED:
        return keyed, match, None, None
    view, method = match.func, str(request.method)
    if getattr(view, EXEMPT_ATTRIBUTE, False) or getattr(view, RECEIVER_ATTRIBUTE, False):
        return keyed, match, None, None
    if (drf := drf_protection(view, method)) is not None:
        return keyed, match, None, None if drf == DRF_LEFT_ALONE else drf
    if (view_class := getattr(view, "view_class", None)) is not None:
        # A class-based view's handler may bear its own mark (as_view() copies dispatch's).
        handler = getattr(view_class, method.lower(), None)
        if getattr(handler, EXEMPT_ATTRIBUTE, False) or getattr(handler, RECEIVER_ATTRIBUTE, False):
            return keyed, match, None, None
        if getattr(handler, PROTECTED_ATTRIBUTE, False):
            return keyed, match, None, DRF_PROTECTED  # @idempotent on the method decides
    if getattr(view, PROTECTED_ATTRIBUTE, False):
        return keyed, match, None, DRF_PROTECTED
    if (ninja := ninja_protection(view, method)) is not None:
        return keyed, match, None, None if ninja == DRF_LEFT_ALONE else ninja
    required = bool(settings.REQUIRED_PATHS) and key_required(request.path_info, match)
    if not keyed and not required:
        return keyed, match, None, None
    return keyed, match, (view, KEY_REQUIRED if required else KEY_OPTIONAL), None


def runs_in_a_thread(request: HttpRequest, match: ResolverMatch | None) -> bool:
    """Under ASGI: an unsafe request to a sync view, whose work a door of the library may
    protect inside the view."""
    if request.method not in idempotency_settings.METHODS or not idempotency_settings.ENABLED:
        return False
    match = match or match_of(request)
    return match is not None and not iscoroutinefunction(match.func)


def key_required(path: str, match: ResolverMatch) -> bool:
    """A plain view needs a key where ``REQUIRED_PATHS`` says so, except the admin and auth."""
    if not any(pattern.match(path) for pattern in idempotency_settings.REQUIRED_PATHS):
        return False
    return not never_required(match)


def never_required(match: ResolverMatch) -> bool:
    """The admin and Django's auth views: requiring a key there would lock people out."""
    if "admin" in match.app_names:
        return True
    view = getattr(match.func, "view_class", match.func)
    return str(getattr(view, "__module__", "")).startswith(NEVER_REQUIRED_MODULES)
