"""The real-stack layer: requests made the way production makes them.

CSRF enforced and users logged in through the login page, HTML forms,
the middleware orders real projects use, template responses and
class-based views, the Redis store under ``ATOMIC_REQUESTS``, pgbouncer in
transaction pooling mode, and concurrent writers on PostgreSQL and MariaDB.
The project these tests drive is this package: its views, URLs, middleware
and templates.
"""
