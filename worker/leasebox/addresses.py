"""One key per mailbox: the form every count, limit and suppression compares addresses in.

An address names a mailbox, but many addresses name the same one: letter case never matters
in practice, an internationalised domain has an ASCII form, and some mail services ignore
the dots of a local part or deliver `name+anything` to `name`. Someone who wants to flood a
mailbox, or to get past its suppression, writes it differently each time; so limits and the
suppression list count `mailbox_key(address)`, in which `A.B+x@GMail.com` and
`ab@gmail.com` are one. The rules of a domain are applied only where its service documents
them (`DOMAIN_RULES`): elsewhere a `+` or a dot may be part of a distinct mailbox, so only
case and the IDNA form are folded. The address as given is what is sent.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class DomainRule:
    """How a mail service reads the local part of its addresses."""

    ignores_dots: bool = False
    """`a.b` and `ab` are one mailbox (Gmail)."""

    subaddress: str | None = "+"
    """`name+tag` is delivered to `name`: the tag is dropped from the key."""

    same_as: str | None = None
    """Another domain of the same mailboxes (`googlemail.com` is `gmail.com`)."""


_GMAIL = DomainRule(ignores_dots=True)
_PLUS = DomainRule()

DOMAIN_RULES: dict[str, DomainRule] = {
    "gmail.com": _GMAIL,
    "googlemail.com": DomainRule(ignores_dots=True, same_as="gmail.com"),
    **dict.fromkeys(
        (
            "outlook.com",
            "hotmail.com",
            "live.com",
            "msn.com",
            "icloud.com",
            "me.com",
            "mac.com",
            "fastmail.com",
            "fastmail.fm",
            "proton.me",
            "protonmail.com",
            "pm.me",
            "yandex.com",
            "yandex.ru",
            "zoho.com",
        ),
        _PLUS,
    ),
}


@functools.lru_cache(maxsize=4096)
def ascii_domain(domain: str) -> str:
    """The domain in lower-case IDNA ASCII form (`Bücher.DE` -> `xn--bcher-kva.de`).

    Cached: a producer's recipients share few domains, and every message needs its domain's
    form several times (validation, the keys, the request's fingerprint).
    """
    try:
        return domain.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError("not a valid email address: the domain is not a valid name") from None


def address_key(address: str) -> str:
    """The address with case and the domain's form folded, and nothing else.

    Trimmed, the local part case-folded, the domain in lower-case IDNA ASCII form, so that
    `Ada@Example.com`, ` ada@example.com` and `ada@EXAMPLE.COM` are one address, and so are
    `ada@bücher.de` and `ada@xn--bcher-kva.de`. Mailbox local parts are case-sensitive in
    theory and never in practice.
    """
    local, _, domain = address.strip().rpartition("@")
    return f"{local.casefold()}@{ascii_domain(domain)}"


def mailbox_key(address: str) -> str:
    """The mailbox an address reaches: `address_key`, then the domain's own rules.

    `A.B+x@gmail.com`, `ab@googlemail.com` and `ab@gmail.com` are `ab@gmail.com`;
    `a.b+x@example.com` stays as it is (its service's rules are unknown).
    """
    key = address_key(address)
    local, _, domain = key.rpartition("@")
    rule = DOMAIN_RULES.get(domain)
    if rule is None:
        return key
    if rule.subaddress is not None:
        base = local.split(rule.subaddress, 1)[0]
        local = base or local  # `+tag@` alone names no base mailbox: keep it whole
    if rule.ignores_dots:
        local = local.replace(".", "") or local
    return f"{local}@{rule.same_as or domain}"


def domain_of(address: str) -> str:
    """The lower-case ASCII domain of an address (`''` when it has none)."""
    _, at, domain = address.strip().rpartition("@")
    if not at or not domain:
        return ""
    try:
        return ascii_domain(domain)
    except ValueError:
        return ""
