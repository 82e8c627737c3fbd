"""Enqueue from SQLAlchemy: `leasebox.sqlalchemy.enqueue(session, message, ...)`.

The public face of `leasebox.producer.sqlalchemy` (installed with `leasebox[sqlalchemy]`):
the outbox row is written in the session's own transaction, on whichever PostgreSQL driver
the engine uses (psycopg 3 or asyncpg), with the keyword arguments of `leasebox.enqueue`.
"""

from leasebox.producer.sqlalchemy import enqueue, enqueue_async

__all__ = ["enqueue", "enqueue_async"]
