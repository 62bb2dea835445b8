from __future__ import annotations

import logging

from django.apps import AppConfig

#: Django's loggers whose lines carry a request's URL, which for a webhook
#: receiver holds its trigger token.
URL_LOGGERS = ("django.request", "django.security.csrf", "django.server")


class IdempotencyConfig(AppConfig):
    name = "idempotency_django"
    verbose_name = "Idempotency"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing them registers the system checks (W030 is the receivers').
        from idempotency_django import checks  # noqa: F401
        from idempotency_django.webhooks import receivers  # noqa: F401

        install_log_redaction()


def install_log_redaction() -> None:
    """Put :class:`~idempotency_django.webhooks.receivers.RedactTriggerURLs` on URL_LOGGERS, once.

    On the loggers, not their handlers, so that it applies to any handler; ``dictConfig``
    replaces a logger's handlers but keeps its filters, so no configuration removes it.
    """
    from idempotency_django.webhooks.receivers import RedactTriggerURLs

    for name in URL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, RedactTriggerURLs) for existing in logger.filters):
            logger.addFilter(RedactTriggerURLs())
