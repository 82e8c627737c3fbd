"""Mail providers: how a rendered email leaves leasebox, chosen by one URL.

`provider_from_url(os.environ["LEASEBOX_PROVIDER_URL"])` gives the worker a `Provider`;
`smtp://`, `smtps://`, `http(s)://`, `log://` and `null://` are built in and other schemes
come from the `leasebox.providers` entry-point group. The worker depends only on the names
exported here.
"""

from leasebox.delivery.providers.base import (
    Email,
    Provider,
    SendResult,
    derived_message_id,
)
from leasebox.delivery.providers.registry import (
    BUILTIN_SCHEMES,
    ENTRY_POINT_GROUP,
    ProviderFactory,
    provider_from_url,
)
from leasebox.errors import PermanentProviderError, ProviderError, TransientProviderError

__all__ = [
    "BUILTIN_SCHEMES",
    "ENTRY_POINT_GROUP",
    "Email",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "ProviderFactory",
    "SendResult",
    "TransientProviderError",
    "derived_message_id",
    "provider_from_url",
]
