"""One interface over every way to enqueue through an ORM, so one set of tests covers them all.

A `Producer` holds an open unit of work on a real database: `enqueue` writes in it, `commit`
and `rollback` end it (and the next `enqueue` begins another). Behind it is a SQLAlchemy
`Session` or `Connection` (psycopg 3), an `AsyncSession` or `AsyncConnection` (psycopg 3 or
asyncpg, driven on a private event loop so the tests read top to bottom), or a Django
connection inside `transaction.atomic()`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from psycopg import conninfo

from leasebox.messages import OutboxMessage, Receipt

T = TypeVar("T")

VARIANTS = (
    "sqlalchemy-session-psycopg",
    "sqlalchemy-connection-psycopg",
    "sqlalchemy-asyncsession-psycopg",
    "sqlalchemy-asyncsession-asyncpg",
    "sqlalchemy-asyncconnection-asyncpg",
    "django-atomic-psycopg",
)


class Producer(Protocol):
    def enqueue(self, message: OutboxMessage, **options: Any) -> Receipt: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


def sqlalchemy_url(dsn: str, driver: str) -> str:
    """A SQLAlchemy URL for a libpq DSN, e.g. driver `asyncpg`."""
    from sqlalchemy.engine import URL

    params = conninfo.conninfo_to_dict(dsn)
    return URL.create(
        f"postgresql+{driver}",
        username=str(params.get("user") or "") or None,
        password=str(params.get("password") or "") or None,
        host=str(params.get("host") or "") or None,
        port=int(str(params["port"])) if params.get("port") else None,
        database=str(params.get("dbname") or "") or None,
    ).render_as_string(hide_password=False)


class SessionProducer:
    """A sync `Session` (or its `Connection`) on a psycopg engine."""

    def __init__(self, dsn: str, *, use_connection: bool) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        self._engine = create_engine(sqlalchemy_url(dsn, "psycopg"))
        self._session = Session(self._engine)
        self._use_connection = use_connection
        self._conn = self._engine.connect() if use_connection else None

    def enqueue(self, message: OutboxMessage, **options: Any) -> Receipt:
        import leasebox.sqlalchemy

        return leasebox.sqlalchemy.enqueue(self._conn or self._session, message, **options)

    def commit(self) -> None:
        (self._conn or self._session).commit()

    def rollback(self) -> None:
        (self._conn or self._session).rollback()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._session.close()
        self._engine.dispose()


class AsyncSessionProducer:
    """An `AsyncSession` (or `AsyncConnection`) driven on a private event loop."""

    def __init__(self, dsn: str, *, driver: str, use_connection: bool) -> None:
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        self._loop = asyncio.new_event_loop()
        self._engine = create_async_engine(sqlalchemy_url(dsn, driver))
        self._session = AsyncSession(self._engine)
        self._conn = self._run(self._connect()) if use_connection else None

    async def _connect(self) -> Any:
        return await self._engine.connect()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(work)

    def enqueue(self, message: OutboxMessage, **options: Any) -> Receipt:
        import leasebox.sqlalchemy

        target = self._conn or self._session
        return self._run(leasebox.sqlalchemy.enqueue_async(target, message, **options))

    def commit(self) -> None:
        self._run((self._conn or self._session).commit())

    def rollback(self) -> None:
        self._run((self._conn or self._session).rollback())

    def close(self) -> None:
        async def shut() -> None:
            if self._conn is not None:
                await self._conn.close()
            await self._session.close()
            await self._engine.dispose()

        self._run(shut())
        self._loop.close()


def add_django_database(dsn: str) -> str:
    """Register `dsn` as a new Django connection alias; return the alias."""
    from django.db import connections

    params = conninfo.conninfo_to_dict(dsn)
    alias = f"db_{uuid.uuid4().hex[:10]}"
    configured = connections.configure_settings(
        {
            # Django's defaults are filled in only beside a 'default' alias.
            "default": {"ENGINE": "django.db.backends.dummy"},
            alias: {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": str(params.get("dbname") or ""),
                "USER": str(params.get("user") or ""),
                "PASSWORD": str(params.get("password") or ""),
                "HOST": str(params.get("host") or ""),
                "PORT": str(params.get("port") or ""),
            },
        }
    )
    connections.settings[alias] = configured[alias]
    return alias


def remove_django_database(alias: str) -> None:
    from django.db import connections

    connections[alias].close()
    del connections[alias]
    del connections.settings[alias]


class DjangoProducer:
    """`leasebox.django.enqueue` inside a `transaction.atomic()` that commit/rollback end."""

    def __init__(self, dsn: str) -> None:
        self.alias = add_django_database(dsn)
        self._atomic: Any = None

    def _begin(self) -> None:
        from django.db import transaction

        if self._atomic is None:
            self._atomic = transaction.atomic(using=self.alias)
            self._atomic.__enter__()

    def enqueue(self, message: OutboxMessage, **options: Any) -> Receipt:
        import leasebox.django

        self._begin()
        return leasebox.django.enqueue(message, using=self.alias, **options)

    def _end(self, rollback: bool) -> None:
        from django.db import transaction

        if self._atomic is None:
            return
        if rollback:
            transaction.set_rollback(True, using=self.alias)
        atomic, self._atomic = self._atomic, None
        atomic.__exit__(None, None, None)

    def commit(self) -> None:
        self._end(rollback=False)

    def rollback(self) -> None:
        self._end(rollback=True)

    def close(self) -> None:
        self.rollback()
        remove_django_database(self.alias)


def producer_for(variant: str, dsn: str) -> Producer:
    """The `Producer` named by one of `VARIANTS`."""
    factories: dict[str, Callable[[], Producer]] = {
        "sqlalchemy-session-psycopg": lambda: SessionProducer(dsn, use_connection=False),
        "sqlalchemy-connection-psycopg": lambda: SessionProducer(dsn, use_connection=True),
        "sqlalchemy-asyncsession-psycopg": lambda: AsyncSessionProducer(
            dsn, driver="psycopg", use_connection=False
        ),
        "sqlalchemy-asyncsession-asyncpg": lambda: AsyncSessionProducer(
            dsn, driver="asyncpg", use_connection=False
        ),
        "sqlalchemy-asyncconnection-asyncpg": lambda: AsyncSessionProducer(
            dsn, driver="asyncpg", use_connection=True
        ),
        "django-atomic-psycopg": lambda: DjangoProducer(dsn),
    }
    return factories[variant]()


def configure_django() -> None:
    """Configure Django once per process, with the leasebox app and no default database."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["leasebox.django"],
            DATABASES={},
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        )
        django.setup()
