"""A runnable OTP service: FastAPI and SQLAlchemy (asyncpg), enqueueing with leasebox."""
