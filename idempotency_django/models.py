from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from idempotency_django.stores.digests import record_digest


class IdempotencyRecord(models.Model):
    """One key within one scope: a live reservation or a stored response.

    ``expires_at`` means "takeover allowed after" for a reservation and
    "forget after" for a completed record; past it, the row counts as absent.
    """

    class State(models.TextChoices):
        IN_PROGRESS = "in_progress", _("in progress")
        COMPLETED = "completed", _("completed")

    class Kind(models.TextChoices):
        REQUEST = "request", _("request")
        WEBHOOK = "webhook", _("webhook delivery")
        TASK = "task", _("background task")

    #: The record's identity (:func:`~idempotency_django.stores.digests.record_digest`); the
    #: three columns below are for reading (one too long for its column holds its digest).
    digest = models.CharField(_("digest"), max_length=64)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices, default=Kind.REQUEST)
    #: For a webhook delivery: where its identity came from (a provider name, "body", "fallback").
    source = models.CharField(_("source"), max_length=64, blank=True)
    principal = models.CharField(_("principal"), max_length=255)
    location = models.CharField(_("location"), max_length=255, blank=True)
    key = models.CharField(_("idempotency key"), max_length=255)
    fingerprint = models.CharField(_("request fingerprint"), max_length=128)
    method = models.CharField(_("method"), max_length=16)
    path = models.CharField(_("path"), max_length=2048)
    request_id = models.CharField(_("request id"), max_length=255, blank=True)
    state = models.CharField(_("state"), max_length=16, choices=State.choices)
    token = models.CharField(_("owner token"), max_length=64)
    status_code = models.PositiveSmallIntegerField(_("response status"), null=True, blank=True)
    response_headers = models.JSONField(_("response headers"), default=list, blank=True)
    response_body = models.BinaryField(_("response body"), default=b"", blank=True)
    #: The response was larger than MAX_STORED_BODY: a retry is told so instead of a replay.
    body_omitted = models.BooleanField(_("body not kept"), default=False)
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    completed_at = models.DateTimeField(_("completed"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"))

    class Meta:
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        # Stored responses are other people's data: viewing records is not
        # enough to read them (see idempotency_django.admin).
        permissions = [("view_stored_response", "Can view stored response bodies")]
        constraints = [
            models.UniqueConstraint(fields=["digest"], name="idempotency_record_unique_digest")
        ]
        indexes = [
            # The purge walks expiries; the admin lists newest first.
            models.Index(fields=["expires_at"], name="idempotency_record_expires"),
            models.Index(fields=["created_at", "id"], name="idempotency_record_created"),
            # MAX_KEYS_PER_PRINCIPAL counts a principal's live keys; the
            # principal purge finds them.
            models.Index(fields=["principal", "expires_at"], name="idempotency_record_principal"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.principal}, {self.location or '-'})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Stores write the digest themselves; this covers records made by hand.
        if not self.digest:
            self.digest = record_digest(self.principal, self.location, self.key)
        super().save(*args, **kwargs)

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()


class WebhookDeliveryManager(models.Manager["WebhookDelivery"]):
    def get_queryset(self) -> models.QuerySet[WebhookDelivery]:
        return super().get_queryset().filter(kind=IdempotencyRecord.Kind.WEBHOOK)


class WebhookDelivery(IdempotencyRecord):
    """An accepted (or running) webhook delivery: the same rows, kind "webhook".

    ``principal`` holds the trigger digest (a keyed hash of the endpoint and
    its token, never the token), ``key`` the delivery id.
    """

    objects: ClassVar[WebhookDeliveryManager] = WebhookDeliveryManager()

    class Meta:
        proxy = True
        verbose_name = _("webhook delivery")
        verbose_name_plural = _("webhook deliveries")
