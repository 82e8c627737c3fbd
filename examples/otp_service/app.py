"""An OTP API whose challenge and outbox row commit in one SQLAlchemy transaction.

`POST /otp {"email": ...}` with an `Idempotency-Key` header creates a sign-in challenge (a
hash of its code, never the code) and the outbox row that will email the code, in one
transaction on an asyncpg engine. A retried request with the same key answers with the first
challenge and creates nothing; the same key for another address is 422; more than
`OTP_PER_ADDRESS_PER_HOUR` codes to one address is 429 with `Retry-After`. A leasebox worker
(`leasebox worker --provider ...`) then sends the email, once, even if this service crashed
right after answering.

Run it (PostgreSQL at DATABASE_URL, such as postgresql+asyncpg://app@localhost/app or
postgresql://app@localhost/app; the same URL serves `leasebox migrate` and the worker):

    leasebox migrate                   # the outbox tables, once
    uvicorn --factory examples.otp_service.app:create_app
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from psycopg import conninfo
from pydantic import BaseModel
from sqlalchemy import DateTime, String
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import leasebox
import leasebox.sqlalchemy

CODE_MINUTES = 10


class Base(DeclarativeBase):
    pass


class Challenge(Base):
    """A sign-in challenge: who asked, a hash of the code, until when it is valid."""

    __tablename__ = "otp_challenges"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(254))
    code_sha256: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class OtpRequest(BaseModel):
    email: str


def asyncpg_url(database_url: str) -> str:
    """A libpq DSN (what leasebox reads: a URL or `key=value` pairs) as an asyncpg URL."""
    if "://" in database_url:
        url = make_url(database_url).set(drivername="postgresql+asyncpg")
    else:
        params = conninfo.conninfo_to_dict(database_url)
        url = URL.create(
            "postgresql+asyncpg",
            username=str(params.get("user") or "") or None,
            password=str(params.get("password") or "") or None,
            host=str(params.get("host") or "") or None,
            port=int(str(params["port"])) if params.get("port") else None,
            database=str(params.get("dbname") or "") or None,
        )
    return url.render_as_string(hide_password=False)


def create_app(
    database_url: str | None = None, *, per_address_per_hour: int | None = None
) -> FastAPI:
    """The service; `database_url` defaults to `DATABASE_URL`."""
    engine: AsyncEngine = create_async_engine(
        asyncpg_url(database_url or os.environ["DATABASE_URL"])
    )
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    limit = per_address_per_hour or int(os.environ.get("OTP_PER_ADDRESS_PER_HOUR", "5"))
    guard = leasebox.AbuseGuard(per_recipient=limit, window_seconds=3600)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        yield
        await engine.dispose()

    app = FastAPI(title="OTP service (leasebox example)", lifespan=lifespan)

    @app.post("/otp", status_code=202)
    async def request_code(
        body: OtpRequest,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> JSONResponse:
        if not idempotency_key:
            raise HTTPException(400, "send an Idempotency-Key header, reused when you retry")
        challenge_id = uuid.uuid4().hex
        code = f"{secrets.randbelow(10**6):06d}"
        expires_at = datetime.now(UTC) + timedelta(minutes=CODE_MINUTES)
        try:
            message = leasebox.OutboxMessage(
                kind="otp",
                recipient=body.email,
                aggregate_id=challenge_id,
                delivery_key=f"otp:{challenge_id}",
                data={"minutes_valid": CODE_MINUTES},
                secrets={"code": code},
                expires_at=expires_at,
            )
        except leasebox.InvalidMessage:
            raise HTTPException(422, "email is not a valid address") from None
        async with sessions() as session:
            try:
                receipt = await leasebox.sqlalchemy.enqueue_async(
                    session,
                    message,
                    idempotency_key=idempotency_key,
                    scope="otp",
                    guard=guard,
                    # What identifies the request is its body: each attempt makes a new
                    # challenge id and code, which the default fingerprint would include.
                    request_hash=hashlib.sha256(body.model_dump_json().encode()).hexdigest(),
                )
            except leasebox.IdempotencyConflict:
                await session.rollback()
                raise HTTPException(
                    422, "this Idempotency-Key was used for another request"
                ) from None
            except leasebox.RateLimited as exc:
                await session.rollback()
                raise HTTPException(
                    429,
                    "too many codes for this address; try again later",
                    headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
                ) from None
            if not receipt.reused:
                # A new send: its challenge commits with it. A retried request adds nothing
                # (the first request's challenge stands), and still commits: the commit
                # records the retry on the receipt, which a rollback would erase.
                session.add(
                    Challenge(
                        id=challenge_id,
                        email=body.email,
                        code_sha256=hashlib.sha256(code.encode()).hexdigest(),
                        expires_at=expires_at,
                    )
                )
            await session.commit()
        answer: dict[str, Any] = {
            "challenge_id": receipt.delivery_key.removeprefix("otp:"),
            "outbox_id": receipt.outbox_id,
            "reused": receipt.reused,
        }
        return JSONResponse(answer, status_code=202)

    return app
