"""Settings of the scale-out servers (tests/test_scale_out.py): the example project's, plus

a fast password hasher (every request authenticates with HTTP Basic); with
``SCALE_OUT_CLUSTER`` (a node's URL), the Redis store on a Redis Cluster; with
``SCALE_OUT_WAIT``, ``WAIT_FOR_IN_PROGRESS`` (pub/sub) and ``MAX_KEYS_PER_PRINCIPAL``
(a second key per principal) on too.
"""

import os

from example.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False

CLUSTER = os.environ.get("SCALE_OUT_CLUSTER", "")
if CLUSTER:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": CLUSTER,  # any node: the client finds the others
            "OPTIONS": {"CLIENT_CLASS": "tests.cluster_client.ClusterClient"},
        },
    }
    IDEMPOTENCY = {
        **IDEMPOTENCY,  # noqa: F405
        "STORE": "redis",
        "STORE_OPTIONS": {"cache": "idempotency"},
    }

if os.environ.get("SCALE_OUT_WAIT"):
    IDEMPOTENCY["WAIT_FOR_IN_PROGRESS"] = float(os.environ["SCALE_OUT_WAIT"])
    IDEMPOTENCY["MAX_KEYS_PER_PRINCIPAL"] = 1000
