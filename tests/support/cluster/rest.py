"""A small JSON client for the test control plane, as the administrator or any token.

The tests read and write the cluster through this (or kubectl), never through the code under
test: a bug in the operator's own client must not hide itself by agreeing with its test.
Errors come back as `ApiError` with the server's status and message.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

Body = dict[str, Any]


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, body: Body) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", ""))
        super().__init__(f"{status} {self.reason}: {body.get('message', body)}")


def resource_path(api_version: str, plural: str, namespace: str | None, name: str = "") -> str:
    """The URL path of a resource collection or object (`v1` is the core group)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    path = f"{base}/{plural}"
    return f"{path}/{name}" if name else path


class Rest:
    """Requests to one API server with one identity."""

    def __init__(
        self,
        url: str,
        ca: Path,
        *,
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
        field_manager: str = "leasebox-tests",
    ) -> None:
        self.url = url
        self.field_manager = field_manager
        self._context = ssl.create_default_context(cafile=str(ca))
        if cert:
            self._context.load_cert_chain(str(cert[0]), str(cert[1]))
        self._token = token

    def request(
        self,
        method: str,
        path: str,
        body: Body | None = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> Body:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._context) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = {"message": raw.decode(errors="replace")}
            raise ApiError(exc.code, detail) from None
        return json.loads(payload) if payload else {}

    def get(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> Body | None:
        try:
            return self.request("GET", resource_path(api_version, plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, plural: str, namespace: str | None = None, **query: str
    ) -> list[Body]:
        found = self.request("GET", resource_path(api_version, plural, namespace), query=query)
        return list(found.get("items", []))

    def create(
        self, api_version: str, plural: str, body: Body, namespace: str | None = None
    ) -> Body:
        return self.request("POST", resource_path(api_version, plural, namespace), body)

    def merge_patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: Body,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Body:
        path = resource_path(api_version, plural, namespace, name)
        return self.request(
            "PATCH",
            path + (f"/{subresource}" if subresource else ""),
            patch,
            content_type="application/merge-patch+json",
        )

    def apply(self, body: Body, *, force: bool = False, subresource: str = "") -> Body:
        """Server-side apply under this client's field manager."""
        meta = body["metadata"]
        plural = body["kind"].lower() + "s"
        path = resource_path(body["apiVersion"], plural, meta.get("namespace"), meta["name"])
        query = {"fieldManager": self.field_manager}
        if force:
            query["force"] = "true"
        return self.request(
            "PATCH",
            path + (f"/{subresource}" if subresource else ""),
            body,
            content_type="application/apply-patch+yaml",
            query=query,
        )

    def delete(
        self,
        api_version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
        body: Body | None = None,
    ) -> None:
        try:
            self.request("DELETE", resource_path(api_version, plural, namespace, name), body)
        except ApiError as exc:
            if exc.status != 404:
                raise
