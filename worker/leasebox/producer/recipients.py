"""The domain policy at the signup boundary: refuse addresses that cannot or should not get mail.

A signup or login form that mails a code to any address it is given is used with throwaway
addresses (a disposable-mail service, to get past a one-account-per-person rule) and with
addresses that can receive nothing (a reserved name, a domain without a mail server), whose
bounces count against the sender's reputation. `RecipientPolicy.check` refuses them with a
`RecipientRefused` whose `reason` an API maps to its answer, before anything is written.

Opt-in, and without network on the default path: the disposable domains come from the
`disposable-email-domains` package (a maintained list, updated by upgrading it; a domain is
refused with every subdomain, unless the policy's `allow` names it), the syntax rules are
local, and the MX lookup (dnspython) runs only when `check_mx` is set, bounded by
`mx_timeout`, and lets the address through when DNS itself fails (a resolver down must not
close signups); only an answer that says "no mail here" refuses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from leasebox.addresses import domain_of
from leasebox.errors import ConfigurationError, RecipientRefused

# Names that never receive mail (RFC 2606, RFC 6761, RFC 6762, RFC 7686).
_SPECIAL_TOP_LEVEL = frozenset({"example", "invalid", "test", "localhost", "local", "onion"})
_RESERVED = frozenset({"example.com", "example.net", "example.org"})

DISPOSABLE = "disposable_domain"
INVALID = "invalid_domain"
NO_MAIL = "no_mail_server"


@cache
def disposable_domains() -> frozenset[str]:
    """The maintained list of disposable-mail domains (the `disposable-email-domains`
    package, loaded once)."""
    try:
        from disposable_email_domains import blocklist
    except ModuleNotFoundError:
        raise ConfigurationError(
            "the domain policy's disposable list needs the 'signup' extra: "
            "pip install 'leasebox[signup]'"
        ) from None
    return frozenset(str(domain).lower() for domain in blocklist)


def _suffixes(domain: str) -> Iterator[str]:
    """`a.b.example.com`, `b.example.com`, `example.com`, `com`."""
    labels = domain.split(".")
    for start in range(len(labels)):
        yield ".".join(labels[start:])


@dataclass(frozen=True)
class MxAnswer:
    """What DNS said about a domain's mail: `accepts` False only when DNS said no mail."""

    accepts: bool
    detail: str = ""


@dataclass(frozen=True)
class RecipientPolicy:
    """Which addresses a signup may mail; every check but `check_mx` is local.

    refuse_disposable: refuse the domains of the disposable list and their subdomains.
    allow: domains (with their subdomains) never refused as disposable.
    refuse: more domains (with their subdomains) to refuse as disposable.
    check_mx: look the domain's mail servers up; refuse it when DNS says it has none.
    mx_timeout: the longest the lookup may take, in seconds; past it the address passes.
    nameservers, dns_port: the resolvers to ask (default: the system's).
    """

    refuse_disposable: bool = True
    allow: frozenset[str] = frozenset()
    refuse: frozenset[str] = frozenset()
    check_mx: bool = False
    mx_timeout: float = 2.0
    nameservers: tuple[str, ...] | None = None
    dns_port: int = 53
    _listed: Callable[[], frozenset[str]] = field(
        default=disposable_domains, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not 0 < self.mx_timeout <= 30:
            raise ConfigurationError("the domain policy's mx_timeout must be within (0, 30] s")
        object.__setattr__(self, "allow", frozenset(d.lower() for d in self.allow))
        object.__setattr__(self, "refuse", frozenset(d.lower() for d in self.refuse))
        if self.refuse_disposable:
            self._listed()  # a missing list is a configuration error now, not at a signup

    def local_verdict(self, address: str) -> RecipientRefused | None:
        """The refusal the local checks make (syntax, disposable), or None."""
        domain = domain_of(address)
        labels = domain.split(".")
        if (
            len(labels) < 2
            or labels[-1] in _SPECIAL_TOP_LEVEL
            or labels[-1].isdigit()
            or domain in _RESERVED
            or any(s in _RESERVED for s in _suffixes(domain))
        ):
            return RecipientRefused(INVALID, "the address's domain cannot receive mail")
        suffixes = list(_suffixes(domain))
        if any(s in self.allow for s in suffixes):
            return None
        listed = self._listed() if self.refuse_disposable else frozenset()
        if any(s in self.refuse or s in listed for s in suffixes):
            return RecipientRefused(DISPOSABLE, "addresses of disposable-mail domains are refused")
        return None

    def check(self, address: str) -> None:
        """Raise `RecipientRefused` if the policy refuses `address`; blocks for the MX
        lookup when `check_mx` is set."""
        refused = self.local_verdict(address)
        if refused is None and self.check_mx:
            refused = _mx_refusal(lookup_mx(domain_of(address), self))
        if refused is not None:
            raise refused

    async def check_async(self, address: str) -> None:
        """`check` without blocking the event loop."""
        refused = self.local_verdict(address)
        if refused is None and self.check_mx:
            refused = _mx_refusal(await lookup_mx_async(domain_of(address), self))
        if refused is not None:
            raise refused


def _mx_refusal(answer: MxAnswer) -> RecipientRefused | None:
    if answer.accepts:
        return None
    return RecipientRefused(NO_MAIL, f"the address's domain has no mail server ({answer.detail})")


def _resolver(policy: RecipientPolicy, module: Any) -> Any:
    resolver = module.Resolver(configure=policy.nameservers is None)
    if policy.nameservers is not None:
        resolver.nameservers = list(policy.nameservers)
        resolver.port = policy.dns_port
    resolver.lifetime = policy.mx_timeout
    resolver.timeout = policy.mx_timeout
    return resolver


def _dns() -> Any:
    try:
        import dns.asyncresolver
        import dns.resolver
    except ModuleNotFoundError:
        raise ConfigurationError(
            "the domain policy's MX check needs the 'signup' extra: pip install 'leasebox[signup]'"
        ) from None
    return dns


def _judge(mx: Any) -> MxAnswer:
    """The answer of an MX query: a null MX (RFC 7505) says no mail."""
    exchanges = [(r.preference, r.exchange.to_text()) for r in mx]
    if exchanges and all(exchange == "." for _, exchange in exchanges):
        return MxAnswer(False, "null MX")
    return MxAnswer(True)


def lookup_mx(domain: str, policy: RecipientPolicy) -> MxAnswer:
    """Whether `domain` receives mail, as DNS says within the policy's timeout."""
    dns = _dns()
    resolver = _resolver(policy, dns.resolver)
    try:
        return _judge(resolver.resolve(domain, "MX"))
    except dns.resolver.NXDOMAIN:
        return MxAnswer(False, "no such domain")
    except dns.resolver.NoAnswer:
        pass  # no MX: mail goes to the domain's own address (RFC 5321), if it has one
    except dns.exception.DNSException:
        return MxAnswer(True, "DNS did not answer")
    for record in ("A", "AAAA"):
        try:
            resolver.resolve(domain, record)
            return MxAnswer(True)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            continue
        except dns.exception.DNSException:
            return MxAnswer(True, "DNS did not answer")
    return MxAnswer(False, "no MX and no address")


async def lookup_mx_async(domain: str, policy: RecipientPolicy) -> MxAnswer:
    """`lookup_mx` on dnspython's asyncio resolver, bounded by the policy's timeout too."""
    dns = _dns()
    resolver = _resolver(policy, dns.asyncresolver)
    try:
        async with asyncio.timeout(policy.mx_timeout):
            try:
                return _judge(await resolver.resolve(domain, "MX"))
            except dns.resolver.NXDOMAIN:
                return MxAnswer(False, "no such domain")
            except dns.resolver.NoAnswer:
                pass
            for record in ("A", "AAAA"):
                try:
                    await resolver.resolve(domain, record)
                    return MxAnswer(True)
                except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
                    continue
            return MxAnswer(False, "no MX and no address")
    except (TimeoutError, dns.exception.DNSException):
        return MxAnswer(True, "DNS did not answer")
