"""Who may reach the server at all, before the key rule: the browser's ways in, closed.

A page on any site can POST to 127.0.0.1 with `fetch(..., {mode: "no-cors"})`: a "simple"
request (text/plain, a form) goes without a preflight, so the server's answer is never
read but the request runs (a chat, a steer). A page whose name was rebound to 127.0.0.1
(DNS rebinding) can also read the answers, and sends its own name as Host. So:
- a POST must say `Content-Type: application/json`, which no simple request can (415);
- a request with an `Origin` (browsers send one; SDKs and curl do not) must come from an
  origin named with --cors, or this server's own (403);
- `Host` must be a loopback name, the address the server is bound to, an address literal
  when it is bound to all addresses (a rebound name is never a literal), or a name given
  with --allowed-host: a reverse proxy's public name (403).
Each refusal is one line in OpenAI's error shape, and counted by reason in /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdash.contract.hosts import LOOPBACK_NAMES, host_name, is_ip

WILDCARDS = frozenset({"0.0.0.0", "::", ""})
CORS_HEADERS = "Authorization, Content-Type, X-Api-Key"
CORS_METHODS = "GET, POST, OPTIONS"
# Headers a proxy adds: a request carrying them is not from this machine, whatever its peer.
PROXIED = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


@dataclass(frozen=True)
class Gate:
    bound: str = "127.0.0.1"  # --host
    allowed_hosts: frozenset[str] = frozenset()  # --allowed-host, lower case
    cors: frozenset[str] = field(default_factory=frozenset)  # --cors origins, without a final /

    def host_ok(self, host_header: str) -> bool:
        name = host_name(host_header)
        if not name:
            return False
        if name in LOOPBACK_NAMES or name in self.allowed_hosts or name == self.bound.lower():
            return True
        return self.bound in WILDCARDS and is_ip(name)

    def origin_ok(self, origin: str, scheme: str, host_header: str) -> bool:
        """An Origin named with --cors (or `*` there), or this server's own."""
        o = origin.rstrip("/").lower()
        return "*" in self.cors or o in self.cors or o == f"{scheme}://{host_header}".lower()

    def cors_headers(self, origin: str) -> dict[str, str]:
        """The CORS answer for an origin --cors allows (none for this server's own)."""
        o = origin.rstrip("/").lower()
        if "*" not in self.cors and o not in self.cors:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Headers": CORS_HEADERS, "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Max-Age": "600"}


def json_body(content_type: str) -> bool:
    """application/json, parameters allowed (`; charset=utf-8`); also `+json` types."""
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def check_origin(text: str) -> str:
    """A --cors value: `*` or scheme://host[:port]; the one-line error names what is valid."""
    o = text.strip().rstrip("/")
    if o == "*":
        return o
    if "://" not in o or o.split("://", 1)[0] not in ("http", "https") or not o.split("://", 1)[1] \
            or "/" in o.split("://", 1)[1]:
        raise ValueError(f"{text!r}: an origin is scheme://host[:port] (e.g. http://localhost:3000), or *")
    return o.lower()


def check_host(text: str) -> str:
    """An --allowed-host value: a host name or address, without scheme, port or path."""
    name = text.strip().lower()
    if not name or any(c in name for c in "/:@ ") and not is_ip(name.strip("[]")):
        raise ValueError(f"{text!r}: a host name or address as clients write it in the URL, without "
                         "scheme, port or path (e.g. llm.example.org)")
    return name.strip("[]")
