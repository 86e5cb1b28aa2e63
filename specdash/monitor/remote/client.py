"""HTTP to one server: httpx with connect/read timeouts, optional headers, and errors
that are one line, name the URL, say what to do, and never carry a credential.

Credentials can reach us two ways: `--header "Authorization: Bearer ..."` and userinfo
in the URL (`http://user:pass@host`). Both are registered with the client's Redactor,
and every string this module produces (errors, the URL shown as a label) goes through
it. The display URL never has userinfo.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from specdash.contract.errors import SpecdashError

DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_READ_TIMEOUT = 5.0
# What one answer may weigh. A real /metrics or /slots is kilobytes; a server that sends
# more (endless, or a bomb) is refused before it takes the watcher's memory.
MAX_RESPONSE_BYTES = 8 * 1024 ** 2
MAX_LINE_BYTES = 1024 ** 2  # one server-sent event line of a stream
MAX_REDIRECTS = 5

_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/@\s]+@")
_AUTH_VALUE = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{4,}")


class RemoteError(SpecdashError):
    """One failure of one server, as one line naming its URL. `kind` is one of:
    unreachable, timeout, not_metrics, auth, forbidden, no_metrics, not_found, loading,
    http, bad_response, unknown_backend, bad_reading (it answered, with numbers that
    cannot be counts), too_large (an answer past MAX_RESPONSE_BYTES or a line past
    MAX_LINE_BYTES), redirect (to another server)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message, exit_code=2)
        self.kind = kind


@dataclass
class Redactor:
    """Replaces every registered secret, any URL userinfo and any bearer/basic token
    with '***'."""

    secrets: set[str] = field(default_factory=set)

    def add(self, secret: str) -> None:
        secret = secret.strip()
        if len(secret) >= 3:
            self.secrets.add(secret)
            # The value without its scheme word, as the server might echo it.
            parts = secret.split(None, 1)
            if len(parts) == 2 and len(parts[1]) >= 3:
                self.secrets.add(parts[1])

    def __call__(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        text = _USERINFO.sub(r"\1***@", text)
        return _AUTH_VALUE.sub(lambda m: f"{m.group(1)} ***", text)


def redact_url(url: str) -> str:
    """The URL without userinfo (what labels, events and errors show)."""
    return _USERINFO.sub(r"\1", url)


def parse_header(text: str, index: int = 1) -> tuple[str, str]:
    """'Name: value' -> (name, value). The error never echoes the value."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not name or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name) or not value.strip():
        raise SpecdashError(f"--header #{index}: expected 'Name: value', "
                            f"e.g. --header \"Authorization: Bearer KEY\"")
    return name, value.strip()


@dataclass(frozen=True, slots=True)
class ServerURL:
    base: str  # scheme://host:port[/prefix], no userinfo, no trailing slash
    display: str  # what is shown (same as base)
    username: str | None = None
    password: str | None = None


def parse_url(text: str) -> ServerURL:
    """A server's base URL from what the operator typed: `HOST:PORT`, `http://HOST:PORT`,
    or the full `/metrics` URL (the path is dropped). Raises SpecdashError naming it."""
    raw = text.strip()
    shown = redact_url(raw)
    if not raw:
        raise SpecdashError("URL '': expected http://HOST:PORT (e.g. http://127.0.0.1:8080)")
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        port = parts.port  # raises on a bad port
    except ValueError:
        raise SpecdashError(f"URL {shown!r}: not a valid URL; expected http://HOST:PORT "
                            f"(e.g. http://127.0.0.1:8080)") from None
    if parts.scheme not in ("http", "https"):
        raise SpecdashError(f"URL {shown!r}: scheme {parts.scheme!r} is not supported; use http:// or https://")
    if not parts.hostname:
        raise SpecdashError(f"URL {shown!r}: no host; expected http://HOST:PORT (e.g. http://127.0.0.1:8080)")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    path = parts.path.rstrip("/")
    for tail in ("/metrics", "/slots", "/props", "/health"):
        if path.endswith(tail):
            path = path[: -len(tail)]
    base = urlunsplit((parts.scheme, netloc, path, "", ""))
    return ServerURL(base=base, display=base, username=parts.username, password=parts.password)


def _error_message(response: httpx.Response) -> str:
    """The server's own error message from a JSON error body, if any."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        return ""
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail")
            return str(msg) if msg else ""
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return ""


def _looks_html(response: httpx.Response) -> bool:
    ctype = response.headers.get("content-type", "").lower()
    if "html" in ctype:
        return True
    head = response.text[:200].lstrip().lower()
    return head.startswith(("<!doctype", "<html"))


class Client:
    """One server's HTTP client. Thread-safe for one poller plus one completion stream
    (httpx.Client pools connections and may be shared across threads)."""

    def __init__(self, url: str | ServerURL, headers: dict[str, str] | None = None, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 transport: httpx.BaseTransport | None = None):
        self.url = url if isinstance(url, ServerURL) else parse_url(url)
        self.redact = Redactor()
        headers = dict(headers or {})
        for value in headers.values():
            self.redact.add(value)
        auth: httpx.BasicAuth | None = None
        if self.url.username is not None:
            self.redact.add(self.url.username)
            if self.url.password:
                self.redact.add(self.url.password)
            auth = httpx.BasicAuth(self.url.username, self.url.password or "")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._headers, self._transport = headers, transport  # for again()
        # Identity encoding: a size cap counts what arrives, and a gzip bomb cannot grow
        # past it once unpacked. Redirects are followed by hand (`_send`), to this server
        # only: httpx strips only Authorization on a cross-origin hop, so --header
        # "X-Api-Key: ..." would go wherever a hostile server points.
        self._http = httpx.Client(
            base_url=self.url.base, headers={"Accept-Encoding": "identity", **headers}, auth=auth,
            follow_redirects=False, timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=transport,
        )

    @property
    def display(self) -> str:
        return self.url.display

    def close(self) -> None:
        self._http.close()

    def again(self) -> Client:
        """A new client to the same server, headers and timeouts (this one may be closed)."""
        return Client(self.url, self._headers, connect_timeout=self.connect_timeout,
                      read_timeout=self.read_timeout, transport=self._transport)

    # --- errors ---

    def _where(self, path: str) -> str:
        return self.redact(self.display + path)

    def _transport_error(self, path: str, exc: Exception) -> RemoteError:
        where = self.redact(self.display)  # the server is unreachable, not one endpoint
        if isinstance(exc, httpx.TimeoutException):
            if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
                return RemoteError("timeout", f"{where}: no connection within {self.connect_timeout:g}s; "
                                   f"check the host and port, and that no firewall drops the traffic")
            return RemoteError("timeout", f"{where}: no answer within {self.read_timeout:g}s; "
                               f"the server is overloaded or this port is not an HTTP server")
        if isinstance(exc, httpx.ConnectError):
            reason = str(exc).split("] ", 1)[-1] or "connection failed"
            return RemoteError("unreachable", self.redact(
                f"{where}: cannot connect ({reason}); is the server running, and is "
                f"{self.display} its address (http://HOST:PORT)?"))
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return RemoteError("unreachable", self.redact(
                f"{where}: the connection dropped ({type(exc).__name__}); the server stopped, "
                f"restarted, or is not an HTTP server"))
        return RemoteError("unreachable", self.redact(
            f"{where}: {type(exc).__name__}: {str(exc)[:120]}; is {self.display} an HTTP server?"))

    def _status_error(self, path: str, response: httpx.Response) -> RemoteError:
        where = self._where(path)
        code = response.status_code
        msg = self.redact(_error_message(response))[:160]
        if code == 401:
            return RemoteError("auth", f"{where}: HTTP 401 unauthorized; pass the server's API key "
                               f"with --header \"Authorization: Bearer KEY\"")
        if code == 403:
            return RemoteError("forbidden", f"{where}: HTTP 403 forbidden; the credentials given with "
                               f"--header may not read {path}")
        if code == 501 and path == "/metrics":
            return RemoteError("no_metrics", f"{where}: llama-server was started without --metrics "
                               f"(HTTP 501); restart it with --metrics")
        if code == 503:
            text = f" ({msg})" if msg else ""
            return RemoteError("loading", f"{where}: HTTP 503 unavailable{text}; the server is "
                               f"starting or loading a model, retrying")
        if code == 404:
            return RemoteError("not_found", f"{where}: HTTP 404 not found; is {self.display} a "
                               f"llama-server, vLLM or specdash --metrics-port base URL?")
        if _looks_html(response):
            return RemoteError("not_metrics", f"{where}: HTTP {code}, an HTML page; give the server's "
                               f"base URL (llama-server, vLLM or specdash --metrics-port)")
        text = f": {msg}" if msg else ""
        return RemoteError("http", f"{where}: HTTP {code}{text}")

    # --- requests ---

    def _send(self, request: httpx.Request, path: str, timeout: httpx.Timeout | None = None) -> httpx.Response:
        """Send, following redirects that stay on this server (scheme, host and port);
        the response is open (streamed): the caller reads it within the cap."""
        origin = httpx.URL(self.url.base)
        for _ in range(MAX_REDIRECTS + 1):
            if timeout is not None:
                request.extensions["timeout"] = timeout.as_dict()
            response = self._http.send(request, stream=True)
            if not response.is_redirect:
                return response
            response.close()
            target = response.next_request
            if target is None:
                return response
            if (target.url.scheme, target.url.host, target.url.port) != (origin.scheme, origin.host, origin.port):
                raise RemoteError("redirect", self.redact(
                    f"{self._where(path)}: redirects to {target.url.scheme}://{target.url.netloc.decode()}, "
                    f"another server; give that address if it is the one to watch (headers are not sent there)"))
            request = target
        raise RemoteError("redirect", f"{self._where(path)}: more than {MAX_REDIRECTS} redirects")

    def _read(self, response: httpx.Response, path: str, deadline: float) -> httpx.Response:
        """A streamed answer read whole, within MAX_RESPONSE_BYTES (counted unpacked, as
        it unpacks) and by `deadline` (a server that trickles a byte a second never trips
        the read timeout)."""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise RemoteError("too_large", f"{self._where(path)}: the answer is over "
                                  f"{MAX_RESPONSE_BYTES // 1024 ** 2} MiB; this is not a metrics endpoint")
            if time.monotonic() > deadline:
                raise RemoteError("timeout", f"{self._where(path)}: the answer took over "
                                  f"{self._total_s:g}s to arrive; the server is overloaded or trickling")
            chunks.append(chunk)
        # The same answer, read: its headers but those that described the bytes on the wire.
        kept = [(k, v) for k, v in response.headers.multi_items()
                if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=kept, content=b"".join(chunks), request=response.request)

    @property
    def _total_s(self) -> float:
        return self.connect_timeout + 2 * self.read_timeout

    def _request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                 body: dict[str, Any] | None = None, timeout: float | None = None) -> httpx.Response:
        """One request and its whole answer; any transport failure, redirect off this
        server, answer too large or slow, or non-2xx status -> RemoteError."""
        deadline = time.monotonic() + (self._total_s if timeout is None else timeout + self.connect_timeout)
        limit = None if timeout is None else httpx.Timeout(timeout, connect=self.connect_timeout)
        try:
            request = self._http.build_request(method, path, params=params, json=body)
            opened = self._send(request, path, limit)
            try:
                response = self._read(opened, path, deadline)
            finally:
                opened.close()
        except httpx.HTTPError as exc:
            raise self._transport_error(path, exc) from None
        if response.status_code >= 400:
            raise self._status_error(path, response)
        return response

    def get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        """GET; any transport failure or non-2xx status -> RemoteError."""
        return self._request("GET", path, params=params)

    def metrics_text(self, params: dict[str, str] | None = None) -> str:
        """/metrics as text; an HTML page or JSON here is a clear error, not a parse failure."""
        response = self.get("/metrics", params)
        if _looks_html(response):
            raise RemoteError("not_metrics", f"{self._where('/metrics')}: an HTML page, not Prometheus "
                              f"metrics; give the server's base URL (llama-server, vLLM or "
                              f"specdash --metrics-port), not a web UI or a login page")
        return response.text

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = self.get(path, params)
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past the parser
            kind = "not_metrics" if _looks_html(response) else "bad_response"
            raise RemoteError(kind, f"{self._where(path)}: the answer is not JSON") from None

    def get_json_optional(self, path: str, params: dict[str, str] | None = None) -> Any | None:
        """JSON, or None when the endpoint is absent/disabled/not JSON (a probe). Transport
        failures still raise: the server itself is gone."""
        try:
            return self.get_json(path, params)
        except RemoteError as exc:
            if exc.kind in ("unreachable", "timeout"):
                raise
            return None

    def post_json(self, path: str, body: dict[str, Any], *, timeout: float | None = None) -> Any:
        response = self._request("POST", path, body=body, timeout=timeout)
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None

    def stream_events(self, path: str, body: dict[str, Any], *,
                      read_timeout: float = 120.0) -> Iterator[dict[str, Any]]:
        """POST and yield each server-sent `data: {...}` object until the stream ends
        (`[DONE]` or connection close). A long read timeout: a big prompt's prefill can
        take a while before the first byte."""
        timeout = httpx.Timeout(read_timeout, connect=self.connect_timeout)
        try:
            response = self._send(self._http.build_request("POST", path, json=body), path, timeout)
            try:
                if response.status_code >= 400:
                    raise self._status_error(path, self._read(response, path, time.monotonic() + read_timeout))
                for line in self._lines(response, path):
                    line = line.strip()
                    if not line.startswith("data:"):
                        if line.startswith("{"):  # a non-SSE JSON answer
                            yield _loads(line)
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        return
                    if payload:
                        item = _loads(payload)
                        if item:
                            yield item
            finally:
                response.close()
        except httpx.HTTPError as exc:
            raise self._transport_error(path, exc) from None

    def _lines(self, response: httpx.Response, path: str) -> Iterator[str]:
        """A stream's lines, each within MAX_LINE_BYTES (httpx's iter_lines has no limit)."""
        pending = b""
        for chunk in response.iter_bytes():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
            if len(pending) > MAX_LINE_BYTES:
                raise RemoteError("too_large", f"{self._where(path)}: a streamed line is over "
                                  f"{MAX_LINE_BYTES // 1024 ** 2} MiB")
        if pending:
            yield pending.decode("utf-8", "replace")


def _loads(text: str) -> dict[str, Any]:
    try:
        item = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return item if isinstance(item, dict) else {}


def model_query(model: str | None) -> dict[str, str] | None:
    """The `?model=` query a llama-server router needs on GET endpoints."""
    return {"model": model, "autoload": "false"} if model else None


__all__ = ["Client", "RemoteError", "Redactor", "ServerURL", "parse_url", "parse_header",
           "redact_url", "model_query"]
