"""A django-redis client class for a Redis Cluster: the Redis store's client in cluster mode.

django-redis has no cluster client of its own. The Redis store only needs
``get_redis_connection(alias, write=True)`` to return a redis-py client that
runs its scripts (``register_script``) and waits on pub/sub (``pubsub``):
``redis.cluster.RedisCluster`` does both, and routes each script by the one
key it touches. ``docs/stores.md`` shows this class.
"""

from __future__ import annotations

from typing import Any

from django_redis.client import DefaultClient
from redis.cluster import RedisCluster


class ClusterClient(DefaultClient):
    """``CACHES[...]["OPTIONS"]["CLIENT_CLASS"]``: ``LOCATION`` is any node of the cluster."""

    def connect(self, index: int = 0) -> Any:
        options = self._options
        return RedisCluster.from_url(
            self._server[index],
            socket_connect_timeout=options.get("SOCKET_CONNECT_TIMEOUT", 1),
            socket_timeout=options.get("SOCKET_TIMEOUT", 1),
        )
