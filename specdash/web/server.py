"""textual-serve's server with the guard in front (guard.py).

textual-serve (aiohttp, no internet needed) serves the page, its script and a websocket per
tab, and starts `command` for each websocket: here `python -m specdash.web_tab`, which
runs `specdash attach` (child.py). What this subclass changes:
- every request passes the guard first (Host, Origin, key);
- the page's websocket address is built from the request's own Host, so an SSH tunnel on
  any local port works (textual-serve builds it from the address it was started with);
- it binds the port itself, so `--port 0` can say which port it got, and says so on stderr;
- tabs are bounded: past --max-tabs a new tab gets a 503 (each is a process), and the size a
  tab asks for is clamped (textual-serve passes the page's numbers through as they come).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from specdash.web.guard import NO_FRAMES, authorized, cookie_name, cookie_value, host_allowed, same_origin

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_COLUMNS, MAX_ROWS = 1000, 500  # a terminal no screen shows more of


def clamp_size(width: Any, height: Any) -> tuple[int, int]:
    return max(1, min(to_int(str(width), 80), MAX_COLUMNS)), max(1, min(to_int(str(height), 24), MAX_ROWS))


def child_command() -> str:
    # -P: not the working folder first on the import path (a stray module there would be
    # imported by every tab).
    return f"{shlex.quote(sys.executable)} -P -m specdash.web_tab"


class WebServer(Server):
    def __init__(self, *, host: str, port: int, key: str | None, title: str,
                 say: Callable[[str], None], max_tabs: int = 8) -> None:
        super().__init__(child_command(), host=host, port=port, title=title)
        self.key = key
        self.max_tabs, self.tabs = max_tabs, 0
        self.shown_key = False  # a key made for this run is printed whole: nobody else knows it
        self.secret = secrets.token_bytes(32)  # this run's: the cookie's digest, ended by a restart
        self.say = say
        self.bound_port = port

    def initialize_logging(self) -> None:
        # textual-serve logs to stdout through rich; ours is the CLI's: warnings, on stderr.
        logging.basicConfig(level=logging.WARNING, format="specdash web: %(message)s", stream=sys.stderr)

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._checked(request, handler)
        if not response.prepared:  # a websocket's headers are already sent
            response.headers.update(NO_FRAMES)
        return response

    async def _checked(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.host
        # A key made for this run guards a loopback-only page: it relaxes no Host rule.
        if not host_allowed(host, None if self.shown_key else self.key):
            return web.Response(status=403, text=(
                f"specdash web: Host {host!r} is not this machine's loopback. Open "
                f"http://127.0.0.1:{self.bound_port}/ (through an SSH tunnel from elsewhere), "
                "or start it with --api-key to serve other names.\n"))
        if request.path.startswith("/static/"):
            return await handler(request)
        if request.path == "/ws" and not same_origin(request.headers.get("Origin"), request.scheme, host):
            return web.Response(status=403, text="specdash web: this websocket belongs to the page "
                                f"{request.scheme}://{host}/ and was opened from another origin.\n")
        bearer = request.headers.get("Authorization", "")
        query_key = request.query.get("key")
        cookie = cookie_name(self.bound_port)
        if not authorized(self.key, self.secret, bearer=bearer[7:] if bearer[:7].lower() == "bearer " else None,
                          cookie=request.cookies.get(cookie), query_key=query_key):
            return web.Response(status=401, text="specdash web: this view needs its key. Open "
                                f"{request.scheme}://{host}/?key=KEY once; a cookie keeps it.\n")
        if query_key is not None and self.key is not None:
            # The key leaves the address bar (and the history) at once; the cookie stays.
            # Always to the page itself: a path from the request could send the browser away.
            response = web.Response(status=302, headers={"Location": "/"})
            response.set_cookie(cookie, cookie_value(self.key, self.secret), httponly=True,
                                samesite="Strict", path="/")
            return response
        return await handler(request)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """A tab: one `attach` process, while fewer than --max-tabs run."""
        if self.tabs >= self.max_tabs:
            raise web.HTTPServiceUnavailable(text=f"specdash web: {self.max_tabs} tabs are open (--max-tabs); "
                                             "close one, or start it with a higher --max-tabs\n")
        width, height = clamp_size(request.query.get("width", "80"), request.query.get("height", "24"))
        clamped = request.clone(rel_url=request.rel_url.update_query(width=str(width), height=str(height)))
        self.tabs += 1
        try:
            return await super().handle_websocket(clamped)
        finally:
            self.tabs -= 1

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: Any) -> None:
        resize = app_service.set_terminal_size

        async def clamped(width: Any, height: Any) -> None:
            await resize(*clamp_size(width, height))

        app_service.set_terminal_size = clamped  # a resize message's numbers, clamped too
        await super()._process_messages(websocket, app_service)

    @aiohttp_jinja2.template("app_index.html")
    async def handle_index(self, request: web.Request) -> dict[str, Any]:
        base = f"{request.scheme}://{request.host}"
        ws = ("wss" if request.scheme == "https" else "ws") + f"://{request.host}/ws"
        return {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": ws,
            "config": {"static": {"url": f"{base}/static/"}},
            "application": {"name": self.title},
        }

    async def on_startup(self, app: web.Application) -> None:
        pass  # textual-serve prints a logo on stdout; run() says where it listens instead

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM; each open tab's process is told to quit."""
        self.initialize_logging()
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # before the port is taken: any stop is clean
            loop.add_signal_handler(sig, stop.set)
        runner = web.AppRunner(await self._make_app(), handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.bound_port = int(address[1])
                break
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = f"http://{host}:{self.bound_port}/"
        self.say(f"web view of {self.title} listening on {url}"
                 + ((f" (open it once as {url}?key={self.key}; a cookie keeps it)" if self.shown_key
                     else " (open it once as /?key=KEY; a cookie keeps it)") if self.key else "")
                 + "; each browser tab runs its own `specdash attach`. Ctrl+C stops.")
        await stop.wait()
        await runner.cleanup()
