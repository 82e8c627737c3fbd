"""Reading the emulated API's requests: kmock's `Request` from a raw aiohttp request.

kmock parses the URL before any overridable hook, and its parser cannot address the
`namespaces` resource, so the emulator parses requests itself (with `semantics.parse_path`)
and works out what a write's field manager is, as the API server does.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import aiohttp.web
import kmock

from support.kube.semantics import guess_action, parse_path

Body = dict[str, Any]


async def parse_request(raw: aiohttp.web.BaseRequest, request_id: int) -> kmock.Request:
    body = await raw.read()
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    params = dict(raw.query)
    parsed = parse_path(raw.path)
    resource, namespace, name, subresource = parsed if parsed else (None, None, None, None)
    return kmock.Request(
        id=request_id,
        raw_request=raw,
        url=raw.url,
        method=raw.method,
        params=params,
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        body=body,
        text=body.decode("utf-8", "replace"),
        data=data,
        action=guess_action(name, raw.method, params) if parsed else None,
        resource=resource,
        namespace=namespace,
        name=name,
        subresource=subresource,
    )


def with_status(obj: Body, status: Any) -> Body:
    """A copy of `obj` whose status is `status` (none when it is None)."""
    result = {key: copy.deepcopy(value) for key, value in obj.items() if key != "status"}
    return result if status is None else result | {"status": copy.deepcopy(status)}


def manager_of(request: kmock.Request) -> str:
    """The field manager of a write: `fieldManager`, else the user-agent's product name."""
    explicit = request.params.get("fieldManager")
    if explicit:
        return explicit
    agent = {k.lower(): v for k, v in request.headers.items()}.get("user-agent", "unknown")
    return agent.split("/", 1)[0].split(" ", 1)[0] or "unknown"


def named(request: kmock.Request) -> tuple[kmock.resource, str]:
    if request.resource is None or request.name is None:
        raise kmock.KubernetesEndpointNotFoundError()
    return request.resource, request.name
