"""One pool's view of Kubernetes for its poll loop: the worker Deployment, scale, Events.

The poll loop (`polling.PoolPoller`) asks for its Deployment every poll. At hundreds of
pools a read per poll was most of the operator's API traffic, so the Deployment comes from
the operator's watch (`handlers.WorkerDeployments`) when it has one, and from a read only
when it does not; the generation tells a scale the loop made from an edit by someone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from leasebox_operator.kube import Kube
from leasebox_operator.polling import DeploymentState


@dataclass(frozen=True)
class CachedDeployment:
    """A worker Deployment as the watch last delivered it, with its generation."""

    state: DeploymentState
    generation: int


def cached_deployment(body: Mapping[str, Any]) -> CachedDeployment:
    """What the poll needs of a Deployment object (from a watch event or a read)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    ready, available = int(status.get("readyReplicas") or 0), status.get("availableReplicas")
    state = DeploymentState(int(spec.get("replicas") or 0), ready, int(available or 0))
    return CachedDeployment(state, int((body.get("metadata") or {}).get("generation") or 0))


DeploymentCache = Mapping[tuple[str, str], CachedDeployment]


class PoolKubeAdapter:
    """The poll loop's view of Kubernetes for one pool (implements `polling.PoolKube`).

    The Deployment comes from `cache` (a watch) at no request, else from a read. After a
    scale the replicas asked for are reported until the watch shows a newer generation. A
    new generation not of a scale sets `changed`: the loop applies the children again.
    """

    def __init__(
        self,
        kube: Kube,
        body: Mapping[str, Any],
        namespace: str,
        deployment: str,
        cache: DeploymentCache | None = None,
    ):
        self.kube = kube
        self.body = body
        self.namespace = namespace
        self.deployment = deployment
        self.cache = cache
        self.seen: CachedDeployment | None = None
        self.scaled_to: tuple[int, int] | None = None  # (generation before, replicas asked)
        self.changed = False

    def _cached(self) -> CachedDeployment | None:
        if self.cache is None:
            return None
        return self.cache.get((self.namespace, self.deployment))

    async def read_deployment(self) -> DeploymentState | None:
        seen = self._cached()
        if seen is None:
            found = await self.kube.read("Deployment", self.namespace, self.deployment)
            seen = None if found is None else cached_deployment(found)
            self.scaled_to = None
        previous, self.seen = self.seen, seen
        if seen is None:
            return None
        if self.scaled_to is not None:
            before, replicas = self.scaled_to
            if seen.generation <= before:
                return replace(seen.state, replicas=replicas)
            self.scaled_to = None  # the newer generation is the scale's
        elif previous is not None and seen.generation != previous.generation:
            self.changed = True
        return seen.state

    async def scale(self, replicas: int) -> None:
        await self.kube.scale(self.namespace, self.deployment, replicas)
        if self.seen is not None:
            self.scaled_to = (self.seen.generation, replicas)

    async def event(self, type_: str, reason: str, message: str) -> None:
        await self.kube.post_event(self.body, type_, reason, message)
