"""Many light fake servers on 127.0.0.1 in one thread (asyncio), for the fleet-scale test and
benchmarks/fleet_scale.py. Each answers GET /metrics with vLLM-style exposition text whose
counters grow with time (30 tok/s, 10 drafts/s of 4 tokens, ~55% accepted, one request
running), like a busy server; some misbehave on purpose:

    stall     accepts the connection, reads the request and never answers
    nan       answers a counter that is NaN (a bad reading: "bad" in the row)
    junk      answers bytes that are not Prometheus text ("down": not metrics)

Every request is counted per server, with how many were in flight at once: a client
whose polls piled up would show more than one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

MODEL = "fake/model"


@dataclass
class FakeServer:
    kind: str  # ok | stall | nan | junk
    port: int = 0
    requests: int = 0  # every request (a poll after a failure also asks /props first)
    polls: int = 0  # GET /metrics: one per poll that got that far
    in_flight: int = 0
    max_in_flight: int = 0
    started: float = field(default_factory=time.time)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> bytes:
        elapsed = time.time() - self.started
        drafts = int(10 * elapsed)
        accepted = int(2.2 * drafts)
        per_pos = [min(drafts, int(accepted * share)) for share in (0.4, 0.3, 0.2, 0.1)]
        tokens = "NaN" if self.kind == "nan" else str(float(int(30 * elapsed)))
        labels = f'engine="0",model_name="{MODEL}"'
        lines = [
            f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {self.started}",
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} 1.0",
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{labels}}} 0.0",
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{labels}}} {float(5 * int(elapsed))}",
            f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{labels}}} {tokens}",
            f"# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{{{labels}}} {float(drafts)}",
            f"# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(4 * drafts)}",
            f"# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(accepted)}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(v)}'
              for i, v in enumerate(per_pos)),
        ]
        return ("\n".join(lines) + "\n").encode()


class FakeFleet:
    """`n` servers: the first `stall` stall, the next `nan` send NaN, the next `junk` send
    junk, the rest are well. Runs its own event loop in a daemon thread."""

    def __init__(self, n: int, *, stall: int = 0, nan: int = 0, junk: int = 0):
        kinds = ["stall"] * stall + ["nan"] * nan + ["junk"] * junk
        self.servers = [FakeServer(kinds[i] if i < len(kinds) else "ok") for i in range(n)]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-fleet", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fake fleet did not start")

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._listeners = []
        for server in self.servers:
            listener = await asyncio.start_server(
                lambda r, w, s=server: self._serve(s, r, w), "127.0.0.1", 0, backlog=64)
            server.port = listener.sockets[0].getsockname()[1]
            self._listeners.append(listener)

    async def _serve(self, server: FakeServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                path = head.split(b" ", 2)[1].split(b"?")[0]
                server.requests += 1
                server.polls += path == b"/metrics"
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.kind == "stall":
                        await reader.read(1)  # until the client gives up and hangs up
                        return
                    if path != b"/metrics":
                        status, body, ctype = b"404 Not Found", b"File Not Found", b"text/plain"
                    elif server.kind == "junk":
                        status, body, ctype = b"200 OK", bytes(range(256)) * 4, b"application/octet-stream"
                    else:
                        status, body, ctype = b"200 OK", server.metrics(), b"text/plain; version=0.0.4"
                    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
                    await writer.drain()
                finally:
                    server.in_flight -= 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def _shutdown(self) -> None:
        for listener in self._listeners:
            listener.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    # A fleet in its own process: python tests/fake_fleet.py N STALL NAN JUNK prints the
    # URLs as one JSON line, serves until stdin closes, then prints each server's
    # [kind, polls, requests, max in flight] as one JSON line.
    import json
    import sys

    n, stall, nan, junk = (int(a) for a in sys.argv[1:5])
    fleet = FakeFleet(n, stall=stall, nan=nan, junk=junk)
    print(json.dumps(fleet.urls), flush=True)
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    print(json.dumps([[s.kind, s.polls, s.requests, s.max_in_flight] for s in fleet.servers]), flush=True)
