"""The operator's one Kubernetes login, shared by kopf and the official client.

kopf authenticates through login handlers; `KubeConnection.login` is ours. It loads the
credentials the way the official client does (in-cluster service account, else the
kubeconfig) into a `kubernetes.aio` configuration, opens the operator's API client on it
and hands kopf the same server, certificates and token as a `ConnectionInfo`. kopf calls
it again when the API answers 401, so a rotated service-account token reaches both.

Why `kubernetes.aio`: it is the asynchronous client shipped in the official `kubernetes`
distribution, with the same generated APIs and models as the synchronous one. The
operator runs in kopf's event loop, so calls need no thread hop, and a cancelled poll
cancels its request.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes.aio import client, config

from leasebox.version import __version__

logger = logging.getLogger(__name__)


class KubeConnection:
    """The current API client; replaced by each login, closed at cleanup."""

    def __init__(self, identity: str = "") -> None:
        self.identity = identity
        self._client: client.ApiClient | None = None
        self._retired: list[client.ApiClient] = []

    @property
    def user_agent(self) -> str:
        suffix = f" ({self.identity})" if self.identity else ""
        return f"leasebox-operator/{__version__}{suffix}"

    async def login(self, *, trust_env: bool = False) -> kopf.ConnectionInfo:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            logger.debug("logged in with the pod's service account")
        except config.ConfigException:
            try:
                await config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except (config.ConfigException, OSError) as exc:
                raise kopf.LoginError(
                    "no in-cluster service account and no usable kubeconfig"
                ) from exc
            logger.debug("logged in with the kubeconfig")
        # The client's own default reads the proxy variables and `.netrc` for every request,
        # in a thread; kopf's `networking.trust_env` (off unless set) decides for both.
        configuration.client_session_kwargs = {"trust_env": trust_env}
        api = client.ApiClient(configuration)
        api.user_agent = self.user_agent
        if self._client is not None:
            self._retired.append(self._client)  # in-flight requests finish on it
        self._client = api
        return await connection_info(configuration, trust_env=trust_env)

    def api(self) -> client.ApiClient:
        if self._client is None:
            raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=1)
        return self._client

    async def close(self) -> None:
        for api in [*self._retired, *([self._client] if self._client else [])]:
            await api.close()  # type: ignore[no-untyped-call]
        self._client, self._retired = None, []


async def connection_info(
    configuration: client.Configuration, *, trust_env: bool
) -> kopf.ConnectionInfo:
    """kopf's view of the same credentials."""
    header: Any = await configuration.get_api_key_with_prefix("BearerToken")
    if not header:
        header = await configuration.get_api_key_with_prefix("authorization")
    parts = str(header).split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=trust_env,
    )
