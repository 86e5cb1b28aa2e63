"""The HTTP surface: OpenAI's routes and the operators' ones, on aiohttp.

aiohttp, not a home-made parser or the standard library's http.server: it streams a
response chunk by chunk from a coroutine, tells a handler when the client has gone (the
write fails, the transport closes), and serves thousands of idle keep-alive connections
from one thread, while the engine keeps its own thread. It runs its own event loop in a
thread of its own (ServerThread), so the dashboard's loop and the engine never wait on it.

Routes:
    POST /v1/chat/completions, POST /v1/completions   OpenAI's, streamed (SSE) or not
    POST /v1/responses                                the Responses API, converted to a chat (serve/responses.py)
    GET  /v1/models, GET /health                      OpenAI's list; ok once calibrated
    GET  /metrics                                     the exporter's registry (Prometheus)
    GET  /props, GET /slots                           llama-server's shapes, for its tools
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import hmac
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from specdash.contract.errors import SpecdashError
from specdash.contract.hosts import is_loopback_address
from specdash.serve.gate import PROXIED, Gate, json_body
from specdash.serve.link import EngineLink
from specdash.serve.protocol import (Ask, BadRequest, call_chunk, chunk, finish_chunk, parse_chat, parse_completion,
                                     response, usage_chunk)
from specdash.serve.request import CallPart, Done, Failed, ServedRequest, Text, Update
from specdash.serve.responses import ResponseEvents, new_id, parse_responses, response_body

KEEPALIVE_S = 5.0  # an SSE comment while a streamed request waits in the queue
# The kernel's send buffer for a stream: a token stream needs kilobytes a second, and a
# client that stops reading then fills this much (not the megabytes autotuning allows)
# before its write waits and --send-timeout can drop it.
STREAM_SNDBUF = 64 * 1024
IDLE_CONNECTION_S = 75.0  # an idle keep-alive connection is closed (aiohttp's default: an hour)
POLL_S = 0.25  # how often a non-streamed request checks that its client is still there
# Routes anyone may read: what a load balancer or Prometheus polls (llama-server's rule).
PUBLIC = {"/health", "/metrics"}
# Routes that change what the engine does, beyond one request: only with the key, or
# from this machine when there is none.
STEERING = {"/v1/specdash/command"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_S = 1  # what a 429 asks a client to wait: a place in the line frees within steps


@dataclass(frozen=True)
class Limits:
    """The work one server takes on (serve --max-waiting, --max-body, --timeout)."""

    max_waiting: int = 64  # requests waiting beyond the batch; the next is a 429
    max_body: int = 1024 ** 2  # bytes of a request body; more is a 413 (aiohttp's own default)
    timeout: float = 600.0  # seconds a request may wait and run in all (llama-server's --timeout)
    send_timeout: float = 30.0  # seconds a stream's write may wait for its client to read


class Refused(BadRequest):
    """A refusal counted in /metrics under `reason` (specdash_http_refusals_total)."""

    def __init__(self, reason: str, message: str, status: int, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message, status=status, kind=kind)
        self.reason, self.headers = reason, headers or {}


def _error(exc: BadRequest) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=getattr(exc, "headers", None))


def make_app(link: EngineLink, api_key: str | None, gate: Gate | None = None,
             limits: Limits | None = None) -> web.Application:
    gate = gate or Gate()
    limits = limits or Limits()

    def refuse(exc: Refused) -> web.Response:
        link.exporter.refused(exc.reason)
        return _error(exc)

    def admit(request: web.Request) -> None:
        """The browser rules (gate.py), then the key rule; raises Refused."""
        host = request.headers.get("Host", "")
        if not gate.host_ok(host):
            raise Refused("host", f"Host {host!r} is not a name of this server; start it with --allowed-host "
                          "NAME to accept that name (a reverse proxy's)", 403, "permission_error")
        origin = request.headers.get("Origin")
        if origin is not None and not gate.origin_ok(origin, request.scheme, host):
            raise Refused("origin", f"Origin {origin!r}: web pages may not call this server; start it with "
                          "--cors ORIGIN to allow that page", 403, "permission_error")
        if request.method == "OPTIONS":
            return  # a preflight: answered by the middleware, needs no key (browsers send none)
        if api_key and request.path not in PUBLIC:
            given = request.headers.get("Authorization", "")
            # The scheme is case-insensitive (RFC 6750); a header's bytes that are not UTF-8
            # come back as surrogates, which compare unequal instead of raising.
            token = given[7:] if given[:7].lower() == "bearer " else request.headers.get("X-Api-Key", "")
            if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), api_key.encode()):
                raise Refused("auth", "a valid API key is needed: send 'Authorization: Bearer KEY'",
                              401, "authentication_error")
        elif request.path in STEERING and (not is_loopback_address(request.remote)
                                           or any(h in request.headers for h in PROXIED)):
            raise Refused("steer", "steering needs an API key unless it comes from 127.0.0.1 (not through "
                          "a proxy)", 403, "permission_error")
        if request.method == "POST" and not json_body(request.headers.get("Content-Type", "")):
            raise Refused("content_type", f"Content-Type {request.headers.get('Content-Type', '')!r}: send the "
                          "body as 'Content-Type: application/json'", 415, "invalid_request_error")

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Who may call (admit) and OpenAI-style errors for every route."""
        try:
            admit(request)
            if request.method == "OPTIONS" and "Origin" in request.headers:
                return web.Response(status=204)  # the CORS headers: on_response_prepare
            return await handler(request)
        except Refused as exc:
            return refuse(exc)
        except BadRequest as exc:
            return _error(exc)
        except web.HTTPException as exc:
            if exc.status == 413:
                return refuse(Refused("body_too_large", f"the request body is over {limits.max_body} bytes "
                                      "(serve --max-body)", 413, "invalid_request_error"))
            if exc.status >= 400 and exc.content_type != "application/json":
                bad = BadRequest(f"{request.method} {request.path}: {exc.reason}", status=exc.status,
                                 kind="not_found_error" if exc.status == 404 else "invalid_request_error")
                return _error(bad)
            raise

    app = web.Application(middlewares=[guard], client_max_size=limits.max_body)

    async def cors(request: web.Request, response: web.StreamResponse) -> None:
        """A page --cors allows may read every answer, errors and streams included."""
        origin = request.headers.get("Origin")
        if origin is not None:
            response.headers.update(gate.cors_headers(origin))

    app.on_response_prepare.append(cors)

    async def body_of(request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except RecursionError:  # nesting deeper than the parser's stack
            raise BadRequest("the request body nests too deeply to read (arrays or objects inside "
                             "each other thousands of levels deep)") from None
        except ValueError as exc:  # invalid JSON, not UTF-8, or an integer of thousands of digits
            raise BadRequest(f"the request body is not valid JSON ({exc})") from None

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _generate(request, parse_completion(await body_of(request)))

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _generate(request, parse_chat(await body_of(request)))

    async def responses(request: web.Request) -> web.StreamResponse:
        return await _generate(request, parse_responses(await body_of(request)))

    async def _generate(request: web.Request, ask: Ask) -> web.StreamResponse:
        if not link.ready:
            raise BadRequest(f"the model is {link.status}; try again when /health says ok",
                             status=503, kind="unavailable_error")
        full()
        # Any name is served, as llama-server does (clients come configured with "gpt-4o");
        # responses, like /v1/models, name the model that answered.
        ask.model = link.model_id
        ask.max_tokens = ask.max_tokens or link.max_tokens
        tokens = link.tokens_for(ask)  # BadRequest: too long for the context, an unknown drafter
        compiled = link.grammar_for(ask)  # BadRequest: a schema feature no grammar here enforces
        full()  # again: this loop is the only one that adds, so nothing adds between here and submit
        req = ServedRequest(ask, tokens, asyncio.get_running_loop(), client=request.remote or "", compiled=compiled)
        req.deadline = time.monotonic() + limits.timeout
        link.submit(req)
        try:
            if ask.stream:
                return await _stream(request, req)
            return await _whole(request, req)
        finally:
            if req.state in ("waiting", "running"):
                link.cancel(req)  # the client left (or the handler failed): free the engine

    def full() -> None:
        if len(link.queue.waiting()) >= limits.max_waiting:
            raise Refused("queue_full", f"{limits.max_waiting} requests are already waiting (serve --max-waiting); "
                          f"retry after {RETRY_AFTER_S} s", 429, "rate_limit_error",
                          headers={"Retry-After": str(RETRY_AFTER_S)})

    def timed_out(req: ServedRequest) -> str:
        """End a request past --timeout (waiting or running): the engine drops it within a step."""
        link.cancel(req)
        link.exporter.refused("timeout")
        return f"the request ran past the server's --timeout of {limits.timeout:g} s and was cancelled"

    def left(req: ServedRequest, most: float) -> float:
        return max(0.0, min(most, req.deadline - time.monotonic()))

    async def _whole(request: web.Request, req: ServedRequest) -> web.StreamResponse:
        while True:
            try:
                update = await asyncio.wait_for(req.updates.get(), left(req, POLL_S))
            except asyncio.TimeoutError:
                if time.monotonic() >= req.deadline:
                    raise BadRequest(timed_out(req), status=504, kind="timeout_error") from None
                if request.transport is None or request.transport.is_closing():
                    link.cancel(req)
                    return web.Response(status=499)
                continue
            if isinstance(update, Done):  # (Text updates: the whole text comes with Done)
                if req.ask.api == "responses":
                    return web.json_response(response_body(req.ask, new_id(), int(time.time()), update.text,
                                                           update.outcome, update.calls))
                return web.json_response(response(req.ask, _rid(req), update.text, update.outcome, update.tokens,
                                                  update.calls, update.logprobs))
            elif isinstance(update, Failed):
                raise BadRequest(update.message, status=500, kind="server_error")

    async def _stream(request: web.Request, req: ServedRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
        await resp.prepare(request)
        ask, rid, created, first = req.ask, _rid(req), int(time.time()), True

        async def write(data: bytes) -> None:
            """A write within --send-timeout: a client that stopped reading fills the
            socket's buffers and then the write waits; past the limit it is dropped."""
            try:
                await asyncio.wait_for(resp.write(data), limits.send_timeout)
            except asyncio.TimeoutError:
                link.exporter.refused("slow_reader")
                if request.transport is not None:
                    request.transport.abort()
                raise ConnectionResetError("the client stopped reading") from None

        async def send(obj: dict[str, Any] | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
            await write(f"data: {data}\n\n".encode())

        if ask.api == "responses":
            return await _events(req, resp, write)
        try:
            async for update in _follow(req, write):
                if update is None:  # past --timeout
                    await send({"error": {"message": timed_out(req), "type": "timeout_error",
                                          "param": None, "code": 504}})
                    await send("[DONE]")
                elif isinstance(update, Text):
                    await send(chunk(ask, rid, created, update.text, first=first, logprobs=update.logprobs,
                                     offset=update.offset + (len(ask.prompt) if ask.echo else 0)))
                    first = False
                elif isinstance(update, CallPart):
                    await send(call_chunk(ask, rid, created, update.delta, first=first))
                    first = False
                elif isinstance(update, Done):
                    if first and ask.kind == "chat":
                        await send(chunk(ask, rid, created, None, first=True))
                    await send(finish_chunk(ask, rid, created, update.outcome))
                    if ask.include_usage:
                        await send(usage_chunk(ask, rid, created, update.outcome))
                    await send("[DONE]")
                elif isinstance(update, Failed):
                    await send({"error": {"message": update.message, "type": "server_error",
                                          "param": None, "code": None}})
                    await send("[DONE]")
        except ConnectionError:  # the client left (or was dropped): the engine stops within a step
            link.cancel(req)
        except asyncio.CancelledError:
            link.cancel(req)
            raise
        return resp

    async def _follow(req: ServedRequest, write: Callable[[bytes], Awaitable[None]]) -> AsyncIterator[Update | None]:
        """A streamed request's updates as they come, to its last (Done or Failed); a
        keep-alive comment every KEEPALIVE_S while none comes (it also finds a client that
        left); None, and the end, once it runs past --timeout."""
        while True:
            try:
                update = await asyncio.wait_for(req.updates.get(), left(req, KEEPALIVE_S))
            except asyncio.TimeoutError:
                if time.monotonic() >= req.deadline:
                    yield None
                    return
                await write(b": keep-alive\n\n")
                continue
            yield update
            if isinstance(update, (Done, Failed)):
                return

    async def _events(req: ServedRequest, resp: web.StreamResponse,
                      write: Callable[[bytes], Awaitable[None]]) -> web.StreamResponse:
        """A /v1/responses stream: the Responses API's typed events (serve/responses.py)."""
        events = ResponseEvents(req.ask, new_id())

        async def send(batch: list[dict[str, Any]]) -> None:
            for ev in batch:
                await write(f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n".encode())

        try:
            await send(events.start())
            async for update in _follow(req, write):
                if update is None:  # past --timeout
                    await send([events.failed(timed_out(req))])
                elif isinstance(update, Text):
                    await send(events.text(update.text))
                elif isinstance(update, CallPart):
                    await send(events.call(update.delta))
                elif isinstance(update, Done):
                    await send(events.done(update.outcome, update.calls, update.text))
                elif isinstance(update, Failed):
                    await send([events.failed(update.message)])
        except ConnectionError:
            link.cancel(req)
        except asyncio.CancelledError:
            link.cancel(req)
            raise
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": link.model_id, "object": "model", "created": int(link.started), "owned_by": "specdash",
             "meta": link.model_meta()}]})

    async def health(request: web.Request) -> web.Response:
        if link.ready:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": link.status, "error": {"message": f"the model is {link.status}",
                                                                    "type": "unavailable_error", "code": 503}},
                                 status=503)

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = link.metrics()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def props(request: web.Request) -> web.Response:
        return web.json_response(link.props())

    async def slots(request: web.Request) -> web.Response:
        return web.json_response(link.slots(show_clients=bool(api_key)))

    async def command(request: web.Request) -> web.Response:
        body = await body_of(request)
        if not isinstance(body, dict) or not isinstance(body.get("command"), str):
            raise BadRequest("send {\"command\": \"k=4\"} (the syntax of `run --at`)", "command")
        try:
            said = link.command(body["command"])
        except SpecdashError as exc:
            raise BadRequest(str(exc), "command") from None
        return web.json_response({"sent": said})

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/completions", completions)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/props", props)
    app.router.add_get("/slots", slots)
    app.router.add_post("/v1/specdash/command", command)
    return app


def _rid(req: ServedRequest) -> str:
    return f"{'chatcmpl' if req.ask.kind == 'chat' else 'cmpl'}-specdash-{req.id}"


class ServerThread:
    """The aiohttp app on host:port in a thread with its own event loop. `start` returns
    once it listens, or raises a one-line SpecdashError (the port is taken, ...)."""

    def __init__(self, app: web.Application, host: str, port: int):
        self.app, self.host, self.port = app, host, port
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, name="specdash-http", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise SpecdashError(f"--port {self.port}: cannot listen on {self.host}:{self.port} "
                                f"({getattr(self._error, 'strerror', None) or self._error}); pick a free port")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    async def _listen(self) -> None:
        # handler_cancellation: a non-streamed request whose client leaves is cancelled
        # (then `_generate`'s finally frees the engine) instead of decoding for nobody.
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True,
                                     keepalive_timeout=IDLE_CONNECTION_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 3.0) -> None:
        if not self._thread.is_alive():
            return

        async def cleanup() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(timeout)
        except Exception:  # leaving anyway: the process is ending
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
