"""Who may open the web view.

textual-serve checks neither who connects nor from which page. A page on another site can
open a websocket to 127.0.0.1 (browsers do not apply the same-origin policy to websockets),
and a page whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own name as Host.
So:
- the websocket's Origin must be the page's own (the request's scheme and Host);
- without a key, Host must name this machine's loopback (a rebound name never does);
- with a key, every route but the static files needs it: `Authorization: Bearer KEY`, or
  the cookie that opening `/?key=KEY` sets once (SameSite=Strict, so another site's page
  never sends it). Browsers send a host's cookies to all its ports, so the cookie is named
  for this server's port and holds a digest of the key with a secret made at start: another
  service on the host that receives it cannot use it anywhere else, and a restart ends it;
- no other site may frame the page (a framed page's websocket carries the page's own Origin,
  and a disguised frame could take keystrokes).
"""

from __future__ import annotations

import hashlib
import hmac
from specdash.contract.hosts import LOOPBACK_NAMES, host_name

__all__ = ["LOOPBACK_NAMES", "host_name", "same_origin", "host_allowed", "authorized"]
NO_FRAMES = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


def same_origin(origin: str | None, scheme: str, host_header: str) -> bool:
    """The websocket was opened by a page this server served (Origin = scheme://Host)."""
    if not origin or not host_header:
        return False
    return origin.rstrip("/").lower() == f"{scheme}://{host_header}".lower()


def host_allowed(host_header: str, key: str | None) -> bool:
    """Without a key only loopback names; with one, the key is the guard (a rebound name
    carries no cookie of this server's)."""
    return key is not None or host_name(host_header) in LOOPBACK_NAMES


def cookie_name(port: int) -> str:
    return f"specdash_web_{port}"


def cookie_value(key: str, secret: bytes) -> str:
    """What the cookie holds: a digest of the key and this run's secret, never the key."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def authorized(key: str | None, secret: bytes, *, bearer: str | None, cookie: str | None,
               query_key: str | None) -> bool:
    if key is None:
        return True
    if bearer is not None and hmac.compare_digest(bearer.encode(), key.encode()):
        return True
    if query_key is not None and hmac.compare_digest(query_key.encode(), key.encode()):
        return True
    return cookie is not None and hmac.compare_digest(cookie.encode(), cookie_value(key, secret).encode())
