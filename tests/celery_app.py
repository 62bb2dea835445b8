"""The Celery app of the task tests: broker and results on the tests' Redis database.

``celery -A tests.celery_app worker`` runs it (tests/test_task_workers.py); the test
process imports it to send tasks.
"""

import os

import django
from celery import Celery
from django.apps import apps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.task_worker_settings")
if not apps.ready:  # the worker; the test process is set up already
    django.setup()

REDIS_URL = os.environ.get("TESTS_REDIS_URL", "redis://127.0.0.1:6379/15")
#: The worker's broker: Redis, or RabbitMQ (``amqp://...``) when the test says so.
BROKER_URL = os.environ.get("TESTS_BROKER_URL", REDIS_URL)
#: The test process names it for its own workers (worker_env passes it on): a worker
#: another run left behind, still consuming, never takes this run's tasks.
QUEUE = os.environ.get("TESTS_CELERY_QUEUE", "idempotency-django-tests")

app = Celery("tests")
app.conf.update(
    broker_url=BROKER_URL,
    result_backend=REDIS_URL,
    task_default_queue=QUEUE,
    # A task whose worker was killed is delivered again after 3 s, not 1 hour.
    broker_transport_options={"visibility_timeout": 3, "unacked_restore_interval": 1},
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)

import tests.celery_tasks  # noqa: E402, F401  (registers the tasks, after django.setup)
