"""`attach` against a hostile server (the review's M7): answers too large, a gzip bomb, a
trickle, redirects to another server carrying --header credentials, JSON nested past the
parser. Each is one RemoteError naming the server, the watcher's memory stays bounded,
no credential leaves for another origin, and a poller never dies of an answer."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from specdash.monitor.remote.client import MAX_RESPONSE_BYTES, Client, RemoteError
from specdash.monitor.remote.poller import ServerWatch
from test_remote_units import llama_metrics

Route = Callable[[BaseHTTPRequestHandler], None]


class Hostile:
    """An HTTP server on 127.0.0.1 whose routes write what they like, and a record of the
    headers each request brought."""

    def __init__(self, routes: dict[str, Route]):
        self.seen: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                outer.seen.append((path, dict(self.headers.items())))
                route = routes.get(path)
                if route is None:
                    send(self, 404, b"no")
                else:
                    try:
                        route(self)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the client gave up on us: what the test wants

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "text/plain",
         **headers: str) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        h.send_header(name.replace("_", "-"), value)
    h.end_headers()
    h.wfile.write(body)


@pytest.fixture
def hostile():
    made: list[Hostile] = []

    def make(routes: dict[str, Route]) -> Hostile:
        made.append(Hostile(routes))
        return made[-1]

    yield make
    for h in made:
        h.close()


def endless(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.end_headers()  # no length: the body runs until the connection closes
    block = b"# " + b"x" * 65534 + b"\n"
    for _ in range(4 * MAX_RESPONSE_BYTES // len(block)):
        h.wfile.write(block)


def test_an_endless_answer_and_a_gzip_bomb_stop_at_the_cap(hostile):
    bomb = gzip.compress(b"0" * (4 * MAX_RESPONSE_BYTES), compresslevel=9)
    assert len(bomb) < MAX_RESPONSE_BYTES // 100  # small on the wire, huge unpacked
    srv = hostile({"/metrics": endless,
                   "/props": lambda h: send(h, 200, bomb, "application/json", Content_Encoding="gzip")})
    client = Client(srv.url)
    with pytest.raises(RemoteError) as caught:
        client.metrics_text()
    assert caught.value.kind == "too_large" and srv.url in str(caught.value)
    with pytest.raises(RemoteError) as caught:
        client.get_json("/props")
    assert caught.value.kind == "too_large"
    assert all(headers.get("Accept-Encoding") == "identity" for _, headers in srv.seen), srv.seen


def test_a_trickling_answer_times_out_though_every_byte_is_in_time(hostile):
    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", "100")
        h.end_headers()
        for _ in range(100):  # a byte every 0.1 s: never 0.5 s without one
            h.wfile.write(b"#")
            h.wfile.flush()
            time.sleep(0.1)

    srv = hostile({"/metrics": trickle})
    client = Client(srv.url, connect_timeout=0.5, read_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as caught:
        client.metrics_text()
    assert caught.value.kind == "timeout" and time.monotonic() - t0 < 5, caught.value


def test_redirects_are_followed_on_this_server_only_and_credentials_never_leave(hostile):
    elsewhere = hostile({"/metrics": lambda h: send(h, 200, llama_metrics().encode())})
    srv = hostile({
        "/metrics": lambda h: send(h, 302, b"", Location="/real/metrics"),
        "/real/metrics": lambda h: send(h, 200, llama_metrics().encode()),
        "/props": lambda h: send(h, 302, b"", Location=elsewhere.url + "/metrics"),
    })
    client = Client(srv.url, {"X-Api-Key": "sesame-secret"})
    assert "llamacpp:n_decode_total" in client.metrics_text()  # same server: followed, key and all
    assert srv.seen[-1] == ("/real/metrics", srv.seen[-1][1]) and srv.seen[-1][1]["X-Api-Key"] == "sesame-secret"
    with pytest.raises(RemoteError) as caught:
        client.get_json("/props")
    assert caught.value.kind == "redirect" and "another server" in str(caught.value)
    assert "sesame-secret" not in str(caught.value)
    assert elsewhere.seen == []  # never asked, so never sent the key


def test_json_nested_past_the_parser_is_a_bad_answer_and_the_polls_go_on(hostile):
    deep = b"[" * 200000 + b"]" * 200000
    srv = hostile({"/metrics": lambda h: send(h, 200, llama_metrics(processing=1).encode()),
                   "/props": lambda h: send(h, 200, deep, "application/json"),
                   "/slots": lambda h: send(h, 200, deep, "application/json")})
    client = Client(srv.url)
    with pytest.raises(RemoteError) as caught:
        client.get_json("/slots")
    assert caught.value.kind == "bad_response"
    watch = ServerWatch(client)
    for _ in range(3):  # each poll answers (up or down); none raises
        result = watch.poll()
        assert result.ok or result.error is not None
