"""Helpers for tests/test_remote_*.py (imported by them; pytest does not load this file
by itself): a tiny HTTP server that answers canned responses, and a real llama-server
started once per session.

The llama-server is built from the llama.cpp vendored in the llama-cpp-python sdist
(specdash.tuning.llamacpp_tools); tests that need it skip with the reason when it is not built.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

FIXTURES = Path(__file__).parent / "fixtures"

Response = tuple[int, str, bytes]  # status, content type, body


@dataclass
class Canned:
    """Responses by path. A value may be a callable (path, headers) -> Response."""

    routes: dict[str, Response | Callable[[str, dict[str, str]], Response]] = field(default_factory=dict)
    required_header: tuple[str, str] | None = None  # e.g. ("Authorization", "Bearer k")
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    delay: float = 0.0


def text(body: str, status: int = 200, ctype: str = "text/plain; version=0.0.4") -> Response:
    return status, ctype, body.encode()


def as_json(data: Any, status: int = 200) -> Response:
    return status, "application/json; charset=utf-8", json.dumps(data).encode()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a closed source) is not an error worth a traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ReplayServer:
    """An HTTP server on 127.0.0.1 (a free port) answering from a Canned table, in a
    daemon thread. 404 for anything else."""

    def __init__(self, canned: Canned | None = None):
        self.canned = canned or Canned()
        canned_ref = self.canned

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                headers = {k: v for k, v in self.headers.items()}
                canned_ref.seen.append((self.command, self.path, headers))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if canned_ref.delay:
                    time.sleep(canned_ref.delay)
                if canned_ref.required_header is not None:
                    name, value = canned_ref.required_header
                    if self.headers.get(name) != value and path not in ("/health",):
                        status, ctype, body = as_json({"error": {"code": 401, "message": "Invalid API Key",
                                                                  "type": "authentication_error"}}, 401)
                        self._send(status, ctype, body)
                        return
                route = canned_ref.routes.get(path)
                if route is None:
                    self._send(404, "text/plain", b"File Not Found")
                    return
                status, ctype, body = route(self.path, headers) if callable(route) else route
                self._send(status, ctype, body)

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = _answer
            do_POST = _answer

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ReplayServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- a real llama-server ---


@dataclass
class LlamaServer:
    """A llama-server process on 127.0.0.1:port (restartable on the same port)."""

    binary: Path
    model: Path
    port: int
    extra: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    metrics: bool = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        model = ["-m", str(self.model)] if self.model.name else []
        from specdash.engine.repack import tool_args

        return [str(self.binary), *tool_args(), *model, "--host", "127.0.0.1", "--port", str(self.port),
                "-c", "512", "-t", "2", *(["--metrics"] if self.metrics else []), *self.extra]

    def start(self, timeout: float = 120.0) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy in {timeout:g}s; see {self.log_path}")

    def stop(self) -> None:
        """Kill it (SIGKILL: a crash, as an operator's `kill -9` would)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def complete(self, prompt: str, n_predict: int = 48, temperature: float = 0.0, **extra: Any) -> dict[str, Any]:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "cache_prompt": False, **extra}
        response = httpx.post(self.url + "/completion", json=body, timeout=300.0)
        response.raise_for_status()
        return dict(response.json())


def llama_server_binary() -> Path | None:
    try:
        from specdash.tuning import llamacpp_tools
    except ImportError:
        return None
    try:
        if not llamacpp_tools.is_built(["llama-server"]):
            return None
        return Path(llamacpp_tools.tool_path("llama-server"))
    except Exception:  # noqa: BLE001 - any trouble finding it: the tests skip
        return None


# -md alone does not speculate: llama.cpp infers the type from the draft GGUF's metadata
# only for MTP/EAGLE-style drafts (common/arg.cpp), so draft-simple is named.
SPEC_ARGS = ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]


def need_binary() -> Path:
    """The llama-server binary; skip without it, except where it must exist (CI sets
    SPECDASH_REQUIRE_LLAMA_SERVER=1): then fail."""
    binary = llama_server_binary()
    if binary is None:
        why = "llama-server is not built: run `python -m specdash.tuning.llamacpp_tools build`"
        if os.environ.get("SPECDASH_REQUIRE_LLAMA_SERVER"):
            pytest.fail(why)
        pytest.skip(why)
    return binary


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory, smol_path: Any) -> Iterator[LlamaServer]:
    """SmolLM2-135M as target and, the same file, as draft model (-md, draft-simple, K=4),
    with --metrics: the speculative counters really move. One per session; a test that
    stops it starts it again."""
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    server = LlamaServer(need_binary(), Path(smol_path), free_port(),
                         ["-md", str(smol_path), *SPEC_ARGS, "-np", "1"], log_path)
    server.start()
    yield server
    server.stop()


def router_preset(model: Path) -> str:
    """A --models-preset INI with two presets of the same model: a draft model at K=4 (loaded
    at startup) and n-gram lookup."""
    return f"""version = 1

[*]
c = 512
t = 2

[smollm2@draft-k4]
model = {model}
model-draft = {model}
spec-type = draft-simple
spec-draft-n-max = 4
load-on-startup = true

[smollm2@ngram]
model = {model}
spec-type = ngram-simple
spec-ngram-simple-size-n = 3
spec-ngram-simple-size-m = 6
"""


def env_without_proxy() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
