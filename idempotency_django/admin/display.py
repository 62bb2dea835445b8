"""How the admin shows a record: its stored response, the user its principal names, its times.

Stored responses are other people's data. :func:`render_body` and :func:`render_headers`
show them whole, for staff holding the ``view_stored_response`` permission;
:func:`render_body_summary` and :func:`render_headers` without values show everyone else
only what cannot carry the response's data: the size, the content type and a keyed
digest of the body (equal digests mean equal bodies), and the names of the headers.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models import Q
from django.db.models.functions import Lower
from django.db.models.lookups import Exact
from django.utils import formats, timezone
from django.utils.crypto import salted_hmac
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency_django.models import IdempotencyRecord
from idempotency_django.stores.base import StoreUnavailable
from idempotency_django.stores.encryption import open_columns

#: Bodies longer than this are shown cut, with a note.
BODY_DISPLAY_LIMIT = 64 * 1024
#: How much of a binary body is shown as hex.
BINARY_PREVIEW = 32
#: Hex digits of a body's digest shown without the permission: enough to tell
#: stored bodies apart at a glance.
BODY_DIGEST_LENGTH = 12
#: The longest value :func:`render_token` keeps on one line.
TOKEN_MAX_LENGTH = 16
#: Salt of the keyed body digest (see :func:`body_digest`).
BODY_DIGEST_SALT = "idempotency_django.admin.body_digest"


def render_body(body: bytes | memoryview | None) -> SafeString:
    """A stored body for display: pretty JSON, escaped text, or a note for binary data."""
    data = bytes(body or b"")
    if not data:
        return format_html("<em>{}</em>", _("(empty)"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return format_html(
            "<em>{}</em><br><code>{}{}</code>",
            _("%(count)d bytes, binary (not UTF-8)") % {"count": len(data)},
            data[:BINARY_PREVIEW].hex(" "),
            " …" if len(data) > BINARY_PREVIEW else "",
        )
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    note = ""
    if len(text) > BODY_DISPLAY_LIMIT:
        note = _("(cut: showing %(shown)d of %(total)d characters)") % {
            "shown": BODY_DISPLAY_LIMIT,
            "total": len(text),
        }
        text = text[:BODY_DISPLAY_LIMIT]
    return format_html(
        '<pre class="idempotency-body" style="white-space: pre-wrap; max-height: 40em; '
        'overflow: auto; margin: 0">{}</pre>{}',
        text,
        format_html("<em>{}</em>", note) if note else "",
    )


def _header_pairs(headers: Any) -> list[tuple[str, str]]:
    return [
        (str(pair[0]), str(pair[1]))
        for pair in headers or []
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    ]


def render_headers(headers: Any, *, values: bool = True) -> SafeString:
    """Stored headers (a list of ``[name, value]``) as an HTML table.

    Without ``values`` only the content type's value is shown: others can carry
    the response's data (``Location: /invoices/981/``, an ``ETag`` derived from it).
    """
    pairs = _header_pairs(headers)
    if not pairs:
        return format_html("<em>{}</em>", _("(none)"))
    hidden = format_html('<span class="quiet">{}</span>', _("(hidden)"))
    rows = format_html_join(
        "\n",
        "<tr><th scope='row'>{}</th><td>{}</td></tr>",
        ((n, v if values or n.lower() == "content-type" else hidden) for n, v in pairs),
    )
    return format_html('<table class="idempotency-headers"><tbody>{}</tbody></table>', rows)


def body_digest(body: bytes) -> str:
    """A keyed SHA-256 of ``body`` (HMAC with ``SECRET_KEY``), cut to ``BODY_DIGEST_LENGTH``.

    Keyed, because a plain hash of a body with few possible values
    (``{"approved": false}``) would tell which one it is to anyone who hashes them.
    """
    return salted_hmac(BODY_DIGEST_SALT, body, algorithm="sha256").hexdigest()[:BODY_DIGEST_LENGTH]


def render_body_summary(body: bytes | memoryview | None, headers: Any) -> SafeString:
    """Size, content type and a digest prefix of a stored body, never its bytes."""
    data = bytes(body or b"")
    content_type = next((v for n, v in _header_pairs(headers) if n.lower() == "content-type"), "")
    summary = format_html(
        '{}, {}, {} <code class="idempotency-body-digest">{}</code>',
        _("%(count)d bytes") % {"count": len(data)},
        content_type or _("no content type"),
        _("digest"),
        body_digest(data),
    )
    return format_html(
        '<span class="idempotency-body-summary">{}</span><br><span class="quiet">{}</span>',
        summary if data else format_html("<em>{}</em>", _("(empty)")),
        _("Showing stored bodies needs the “Can view stored response bodies” permission."),
    )


def render_opened(obj: IdempotencyRecord, render: Callable[[Any, bytes], SafeString]) -> SafeString:
    """``render(headers, body)`` of the record's stored response, or a note that no key opens it."""
    opened = open_stored_response(obj)
    if opened is None:
        return format_html(
            "<em>{}</em>", _("(encrypted with a key that IDEMPOTENCY no longer holds)")
        )
    return render(*opened)


def open_stored_response(obj: IdempotencyRecord) -> tuple[Any, bytes] | None:
    """The record's stored headers and body, decrypted; None when they cannot be.

    Kept on the object: a detail page renders the headers and the body apart.
    """
    if not hasattr(obj, "_idempotency_opened"):
        try:
            opened: tuple[Any, bytes] | None = open_columns(
                obj.response_headers, obj.response_body, obj.digest, obj.kind
            )
        except StoreUnavailable:  # no key opens it, it is another record's, or bad keys (E015)
            opened = None
        obj._idempotency_opened = opened  # type: ignore[attr-defined]
    return obj._idempotency_opened  # type: ignore[attr-defined,no-any-return]


# The default scope function names a user "app_label.model:pk" (see
# idempotency_django.protocol.scope.principal_of). Principals of any other form, or of
# another model, are shown and searched as they are.


def principal_usernames(principals: Iterable[str]) -> dict[str, str]:
    """``{principal: username}`` for the principals naming an existing user: one query."""
    user_model = get_user_model()
    prefix, pk_field = f"{user_model._meta.label_lower}:", user_model._meta.pk
    assert pk_field is not None
    pks = set()
    for principal in principals:
        if principal.startswith(prefix):
            with contextlib.suppress(ValidationError):
                pks.add(pk_field.to_python(principal.removeprefix(prefix)))
    if not pks:
        return {}
    rows = user_model._default_manager.filter(pk__in=pks).values_list(
        "pk", user_model.USERNAME_FIELD
    )
    # Keyed the way principal_of writes them, so "auth.user:042" names nobody.
    return {f"{prefix}{pk}": str(name) for pk, name in rows}


def principals_of_users(term: str) -> list[str]:
    """The principals of the users whose username or email address is ``term``, any case.

    Whole values only: an operator looking for one person's records types their name or
    address, and a partial match on a large user table would be an unbounded ``IN`` list.
    """
    term = term.strip()
    if not term:
        return []
    user_model = get_user_model()
    fields = {user_model.USERNAME_FIELD, user_model.get_email_field_name()}
    # Lower() rather than iexact: on MySQL/MariaDB iexact follows the column's
    # collation, and a binary one would make the search case-sensitive.
    matches = Q()
    for field in fields:
        with contextlib.suppress(FieldDoesNotExist):
            user_model._meta.get_field(field)
            matches |= Q(Exact(Lower(field), term.lower()))
    pks = user_model._default_manager.filter(matches).values_list("pk", flat=True)
    return [f"{user_model._meta.label_lower}:{pk}" for pk in pks]


def render_principal(principal: str, username: str | None) -> SafeString:
    """``alice (auth.user:1)`` for a principal naming a user, the principal alone otherwise."""
    if username is None:
        return render_token(principal)
    return format_html(
        '{} <span class="quiet">{}</span>', render_token(username), render_token(f"({principal})")
    )


def render_token(text: str, breaks_after: str = "") -> SafeString:
    """A value read whole (a username, ``(auth.user:1)``, a method) in a list column:
    never broken across lines, so "alice (auth.user:1" / ")" cannot happen.

    With ``breaks_after`` (``/`` for a path) the value may break after those characters,
    each part kept whole. Only a part longer than :data:`TOKEN_MAX_LENGTH` (a digest
    principal), which would widen its column past a 1280 px window, may break anywhere.
    """
    parts = re.split(f"(?<=[{re.escape(breaks_after)}])", text) if breaks_after else [text]
    return format_html_join(
        mark_safe("<wbr>"),
        '<span class="{}">{}</span>',
        (
            ("idempotency-token" if len(part) <= TOKEN_MAX_LENGTH else "idempotency-long", part)
            for part in parts
            if part
        ),
    )


def render_relative_time(value: datetime | None) -> SafeString | str:
    """Say "5 minutes ago" or "in 23 hours", with the date and time on hover: keys live
    minutes to days, so how long ago and how soon matter more in the list than the date."""
    if value is None:
        return ""
    now = timezone.now()
    if abs(value - now) < timedelta(minutes=1):
        text = gettext("now")
    elif value < now:
        text = gettext("%(delta)s ago") % {"delta": timesince(value, now, depth=1)}
    else:
        text = gettext("in %(delta)s") % {"delta": timeuntil(value, now, depth=1)}
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        local.isoformat(),
        formats.date_format(local, "DATETIME_FORMAT"),
        text,
    )
