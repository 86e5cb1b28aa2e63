"""`specdash serve` through faults, on a real server on 127.0.0.1 (SmolLM2-135M, no draft):
an engine failure mid-request (llama_decode reporting failure, on purpose: the fault file of
contract/faults.py) fails that request with an error event while the one waiting runs after
the engine reloads; a client that stops reading is dropped and its request cancelled; a
waiting request whose client leaves is out of the line at once."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from test_serve import _metric, sse_payloads, start_server, stop_server

LONG = {"prompt": "Count: 1, 2, 3,", "max_tokens": 1900, "temperature": 0}


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory):
    return tmp_path_factory.mktemp("faults") / "fail-next-decode"


def serve(fault_file, *extra: str):
    return start_server("--target", "smollm2-135m", "--draft", "none", "--send-timeout", "1", *extra,
                        env={"SPECDASH_FAULT_FILE": str(fault_file)})


@pytest.fixture(scope="module")
def server(fault_file):
    proc, url, lines = serve(fault_file, "--parallel", "1")
    yield url, lines
    assert stop_server(proc) == 0, "".join(lines)


def long_stream(url: str) -> tuple[threading.Thread, list[str]]:
    """A long streamed completion in a thread, returned once it is decoding, with the
    payloads it receives."""
    events: list[str] = []
    started = threading.Event()
    thread = threading.Thread(target=sse_payloads, args=(url, {**LONG, "stream": True}, events, started))
    thread.start()
    assert started.wait(60)
    return thread, events


def wait_until(what, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"timed out: {what.__doc__ or what}"
        time.sleep(0.05)


def test_an_engine_fault_fails_the_request_running_and_the_waiting_one_runs(server, fault_file):
    url, lines = server
    a, events = long_stream(url)
    waited: list[httpx.Response] = []
    b = threading.Thread(target=lambda: waited.append(httpx.post(
        url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0}, timeout=300)))
    b.start()
    wait_until(lambda: _metric(url, "specdash_num_requests_waiting") >= 1)
    fault_file.touch()  # the next llama_decode fails, mid-stream
    a.join(120)
    b.join(120)
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]["message"]
    assert "engine failed" in error and "llama_decode failed" in error, error
    assert waited[0].status_code == 200 and waited[0].json()["usage"]["completion_tokens"] >= 1, waited[0].text
    assert not fault_file.exists()  # one touch, one fault
    assert "the engine reloads" in "".join(lines)
    wait_until(lambda: httpx.get(url + "/health", timeout=10).status_code == 200)


def test_a_client_that_stops_reading_is_dropped_and_its_request_cancelled(server):
    url, _ = server
    before = _metric(url, "specdash_http_refusals_total", 'reason="slow_reader"')
    aborted = _metric(url, "specdash_request_success_total", 'finished_reason="abort"')
    host, port = url.rsplit("//", 1)[1].split(":")
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes little, then nothing
    raw.connect((host, int(port)))
    body = json.dumps({**LONG, "stream": True}).encode()
    raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    try:
        wait_until(lambda: _metric(url, "specdash_http_refusals_total", 'reason="slow_reader"') == before + 1, 120)
        wait_until(lambda: _metric(url, "specdash_request_success_total", 'finished_reason="abort"') == aborted + 1)
        ok = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200
    finally:
        raw.close()


def test_a_waiting_request_whose_client_leaves_is_out_of_the_line_at_once(server):
    url, _ = server
    a, events = long_stream(url)

    def leave() -> None:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/completions", json=LONG, timeout=1.0)

    leavers = [threading.Thread(target=leave) for _ in range(5)]
    for t in leavers:
        t.start()
    wait_until(lambda: _metric(url, "specdash_num_requests_waiting") >= 1)
    for t in leavers:
        t.join(30)
    wait_until(lambda: _metric(url, "specdash_num_requests_waiting") == 0, 5)
    assert a.is_alive(), "the line emptied because the stream ended, not because they left"
    a.join(300)
    assert events[-1] == "[DONE]"


def test_a_fault_in_a_batch_fails_the_batch_and_the_next_request_runs(fault_file):
    proc, url, lines = serve(fault_file, "--parallel", "2")
    try:
        streams, outs = zip(*(long_stream(url) for _ in range(2)))  # both in the batch at once
        fault_file.touch()
        for t in streams:
            t.join(120)
        for out in outs:
            assert out[-1] == "[DONE]" and "engine failed on a batch" in json.loads(out[-2])["error"]["message"]
        ok = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    finally:
        assert stop_server(proc) == 0, "".join(lines)
