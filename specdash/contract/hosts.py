"""Host names as a server reads them from a request's `Host` header: the loopback names,
and the name without its port; and whether a peer's address is loopback. Shared by
serve's and the web view's guards (both refuse a name rebound to 127.0.0.1: DNS
rebinding always sends the attacker's own name)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(host_header: str) -> str:
    """'127.0.0.1:8765' -> '127.0.0.1'; '[::1]:80' -> '::1'; unparsable -> ''."""
    try:
        return (urlsplit(f"//{host_header}").hostname or "").lower()
    except ValueError:
        return ""


def is_loopback_address(address: str | None) -> bool:
    """A peer's address (a socket's, never a header's) is this machine: 127.0.0.0/8, ::1,
    or 127.x mapped into IPv6 (a dual-stack socket reports ::ffff:127.0.0.1)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def is_ip(name: str) -> bool:
    """An address literal: a client typed it, no DNS name was rebound to it."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
