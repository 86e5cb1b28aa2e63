"""Host names as a server reads them from a request's `Host` header: the loopback names,
and the name without its port. Shared by serve's and the web view's guards (both refuse a
name rebound to 127.0.0.1: DNS rebinding always sends the attacker's own name)."""

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


def is_ip(name: str) -> bool:
    """An address literal: a client typed it, no DNS name was rebound to it."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
