"""Watch streams of the emulated API: from a resourceVersion, with selectors and bookmarks.

A watch first gets what it missed (every object when it starts from nothing, the stored
changes after its `resourceVersion` otherwise, and the `initial-events-end` bookmark when
asked for), then each change as it happens, as ADDED, MODIFIED or DELETED *for its
selectors*: an object that starts or stops matching is added or deleted for that watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import attrs
import kmock

from support.kube.semantics import WatchChange

if TYPE_CHECKING:
    from support.kube.server import EmulatedKubeAPI

Body = dict[str, Any]
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@attrs.define(eq=False)
class Watcher:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[WatchChange | None]

    def push(self, change: WatchChange | None) -> None:
        with contextlib.suppress(RuntimeError):  # the watcher's loop is already closed
            self.loop.call_soon_threadsafe(self.queue.put_nowait, change)


async def stream_watch(
    api: EmulatedKubeAPI,
    request: kmock.Request,
    resource: kmock.resource,
    since: str,
    lifetime: float,
) -> AsyncIterator[kmock.Payload]:
    """The events of one watch: the backlog since `since`, then live changes."""
    params = request.params
    label, field = params.get("labelSelector", ""), params.get("fieldSelector", "")
    if request.name is not None:
        field = ",".join(filter(None, [field, f"metadata.name={request.name}"]))
    deadline = asyncio.get_running_loop().time() + lifetime
    watcher = Watcher(asyncio.get_running_loop(), asyncio.Queue())
    backlog: list[Body] = []
    with api._state_lock:
        api._watchers.add(watcher)
        if since in {"", "0"}:
            for obj in api.list_objects(resource, request.namespace, label, field):
                backlog.append({"type": "ADDED", "object": obj})
            if params.get("sendInitialEvents") == "true":
                marker = {
                    "resourceVersion": str(api._rv),
                    "annotations": {INITIAL_EVENTS_END: "true"},
                }
                info = api.info(resource)
                version = f"{resource.group}/{resource.version}".lstrip("/")
                bookmark = {"apiVersion": version, "kind": info.kind, "metadata": marker}
                backlog.append({"type": "BOOKMARK", "object": bookmark})
        else:
            later = [c for c in api._changes if c.version > int(since)]
            events = (c.event_for(resource, request.namespace, label, field) for c in later)
            backlog.extend(event for event in events if event is not None)
    try:
        yield b""  # send the headers now, even if nothing happens for a while
        for event in backlog:
            yield event
        while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                change = await asyncio.wait_for(watcher.queue.get(), min(remaining, 3600))
            except TimeoutError:
                continue
            if change is None:
                return
            live = change.event_for(resource, request.namespace, label, field)
            if live is not None:
                yield live
    finally:
        with api._state_lock:
            api._watchers.discard(watcher)
