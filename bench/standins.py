"""Stand-ins for real mail providers, on loopback, that count what they accept.

`HttpMailApi` is a JSON mail API that answers every POST after a fixed delay (50 ms by
default, a hosted API's typical answer time), with an id; `SmtpServer` is an SMTP server
(aiosmtpd) that accepts every message. Each runs on its own thread and event loop in the
benchmark's process, never in the worker's, so the worker's CPU time is its own, and each
records the delivery key of every message it accepted (the `Idempotency-Key` header, the
`X-Leasebox-Delivery-Key` header), which is how a provider benchmark proves that every
message arrived exactly once. Both are deliberately lean: neither parses more of a message
than that key, so that they cost the shared cores as little as they can.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from aiosmtpd.controller import Controller

from leasebox.testing.ports import free_port

DEFAULT_DELAY_SECONDS = 0.05
_DELIVERY_KEY = re.compile(rb"^X-Leasebox-Delivery-Key:\s*(\S+)", re.MULTILINE | re.IGNORECASE)


class _Counts:
    """Accepted messages by delivery key, shared with the server's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: Counter[str] = Counter()

    def add(self, key: str) -> int:
        with self._lock:
            self._keys[key] += 1
            return sum(self._keys.values())

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._keys)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


class HttpMailApi:
    """A loopback JSON mail API: POST /send answers 200 `{"id": ...}` after `delay` s."""

    def __init__(self, delay_seconds: float = DEFAULT_DELAY_SECONDS) -> None:
        self.delay_seconds = delay_seconds
        self.port = free_port()
        self.counts = _Counts()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        """The endpoint, as a leasebox `http://` provider URL and for a bare client alike."""
        return f"http://127.0.0.1:{self.port}/send"

    async def _send(self, request: web.Request) -> web.Response:
        await request.read()
        key = request.headers.get("Idempotency-Key", "")
        number = self.counts.add(key)
        await asyncio.sleep(self.delay_seconds)
        return web.json_response({"id": f"standin-{number}"})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/send", self._send)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024).start()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the thread that started the server
            self._failure = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        if self._runner is not None:
            loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name="http-mail-api", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None:
            raise RuntimeError(f"the HTTP stand-in did not start: {self._failure}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _SmtpHandler:
    def __init__(self, counts: _Counts) -> None:
        self._counts = counts

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.original_content or envelope.content
        raw = content if isinstance(content, bytes) else str(content).encode()
        found = _DELIVERY_KEY.search(raw)
        self._counts.add(found.group(1).decode() if found else "")
        return "250 2.0.0 Message accepted"


class SmtpServer:
    """A loopback SMTP server (aiosmtpd) that accepts every message and counts its key."""

    def __init__(self) -> None:
        self.port = free_port()
        self.counts = _Counts()
        self._controller = Controller(
            _SmtpHandler(self.counts), hostname="127.0.0.1", port=self.port
        )

    def url(self, pool_size: int) -> str:
        """A leasebox `smtp://` provider URL with `pool_size` pooled connections."""
        return f"smtp://127.0.0.1:{self.port}?starttls=false&pool_size={pool_size}"

    def start(self) -> Self:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
