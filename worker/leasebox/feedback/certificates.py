"""The certificates Amazon SNS signs its messages with, fetched only from SNS itself.

An SNS message names the URL of the certificate that verifies it (`SigningCertURL`). Anyone
can sign a message with a certificate of their own, so the URL is the whole of the trust:
it must be `https://` on the SNS host of the region the topic lives in
(`sns.<region>.amazonaws.com`, `.amazonaws.com.cn` in China), and it is fetched over TLS
verified against the system's roots, without following a redirect (a redirect could lead
anywhere), with a timeout and a size bound. The same rule holds for a subscription's
`SubscribeURL`. Certificates are cached by URL (SNS rotates them rarely).

`host_for_region` and `ssl_context` are there for tests, which serve a certificate of their
own from a loopback HTTPS server; the defaults are strict.
"""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from leasebox.feedback.signing import Refused

MAX_CERTIFICATE_BYTES = 64 * 1024
CACHED = 32


def sns_host(region: str) -> str:
    """The SNS host of a region: where its signing certificates live."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"sns.{region}.{suffix}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


@dataclass
class SigningCertificates:
    """Fetches, checks and caches SNS signing certificates; confirms subscriptions."""

    host_for_region: Callable[[str], str] = sns_host
    ssl_context: ssl.SSLContext | None = None
    timeout: float = 5.0
    _cache: OrderedDict[str, rsa.RSAPublicKey] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_url(self, url: str, region: str, *, path_suffix: str = "") -> str:
        """`url` if it is https on the region's SNS host (and ends with `path_suffix`)."""
        try:
            parts = urlsplit(url)
        except ValueError:
            raise Refused(403, "untrusted_url") from None
        if (
            parts.scheme != "https"
            or parts.netloc.lower() != self.host_for_region(region).lower()
            or parts.username is not None
            or not parts.path.endswith(path_suffix)
        ):
            raise Refused(403, "untrusted_url")
        return url

    def public_key(self, url: str, region: str) -> rsa.RSAPublicKey:
        """The RSA key of the certificate at `url`, once the URL is checked."""
        self.check_url(url, region, path_suffix=".pem")
        with self._lock:
            found = self._cache.get(url)
        if found is not None:
            return found
        pem = self._get(url)
        try:
            key = x509.load_pem_x509_certificate(pem).public_key()
        except ValueError:
            raise Refused(403, "bad_certificate") from None
        if not isinstance(key, rsa.RSAPublicKey):
            raise Refused(403, "bad_certificate")
        with self._lock:
            self._cache[url] = key
            while len(self._cache) > CACHED:
                self._cache.popitem(last=False)
        return key

    def confirm(self, url: str, region: str) -> None:
        """Visit a subscription's `SubscribeURL`, once it is checked: SNS then sends."""
        self.check_url(url, region)
        self._get(url)

    def _get(self, url: str) -> bytes:
        context = self.ssl_context or ssl.create_default_context()
        opener = urllib.request.build_opener(
            _NoRedirects(), urllib.request.HTTPSHandler(context=context)
        )
        try:
            with opener.open(url, timeout=self.timeout) as answer:
                body: bytes = answer.read(MAX_CERTIFICATE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise Refused(502, "sns_unreachable") from None
        except (OSError, urllib.error.URLError):
            raise Refused(503, "sns_unreachable") from None
        if len(body) > MAX_CERTIFICATE_BYTES:
            raise Refused(502, "sns_answer_too_large")
        return body
