"""Bad input to `specdash attach`: one line per server naming the URL and what to do,
exit 2 when no server answered, no traceback, and no credential anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest_remote import Canned, ReplayServer, as_json, free_port, text
from specdash.errors import SpecdashError
from specdash.remote.client import Client, Redactor, RemoteError, parse_header, parse_url, redact_url

HTML = "<!DOCTYPE html><html><head><title>Login</title></head><body>sign in</body></html>"
# What llama-server answers on /metrics when started without --metrics
# (server-context.cpp get_metrics -> format_error_response(..., ERROR_TYPE_NOT_SUPPORTED)).
NO_METRICS = {"error": {"code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`",
                        "type": "not_supported_error"}}


def attach(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdash", "attach", *args],
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_unreachable_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_error_line(attach(url, "--once"), url, "cannot connect", "is the server running")
    assert "/props" not in line  # the server is unreachable, not one endpoint


def test_html_page() -> None:
    with ReplayServer(Canned({"/metrics": text(HTML, ctype="text/html"), "/props": text(HTML, ctype="text/html")})) as srv:
        one_error_line(attach(srv.url, "--once", "--json"), srv.url + "/metrics", "HTML page", "base URL")


def test_401_names_the_flag_and_never_the_key() -> None:
    canned = Canned({"/metrics": text("llamacpp:n_decode_total 1\n")}, required_header=("Authorization", "Bearer right-key-123"))
    with ReplayServer(canned) as srv:
        proc = attach(srv.url, "--once", "--header", "Authorization: Bearer wrong-key-456")
        one_error_line(proc, srv.url + "/metrics", "401", "--header \"Authorization: Bearer KEY\"")
        assert "wrong-key-456" not in proc.stderr + proc.stdout
        ok = attach(srv.url, "--once", "--json", "--interval", "0.2", "--header", "Authorization: Bearer right-key-123")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["state"] == "up"
        assert "right-key-123" not in ok.stdout + ok.stderr
        assert canned.seen and all(h.get("Authorization") == "Bearer right-key-123"
                                   for _, _, h in canned.seen[-2:])


def test_llama_server_without_metrics() -> None:
    canned = Canned({"/metrics": as_json(NO_METRICS, 501), "/props": as_json({"model_path": "/m/smol.gguf"})})
    with ReplayServer(canned) as srv:
        one_error_line(attach(srv.url, "--once"), srv.url + "/metrics", "without --metrics", "restart it with --metrics")


def test_metrics_of_something_else() -> None:
    canned = Canned({"/metrics": text("# TYPE go_goroutines gauge\ngo_goroutines 12\n")})
    with ReplayServer(canned) as srv:
        one_error_line(attach(srv.url, "--once"), srv.url + "/metrics", "llamacpp:, vllm: or specdash:")


def test_once_exits_2_only_when_no_server_answered() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with ReplayServer(Canned({"/metrics": text("# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 3\n")})) as srv:
        proc = attach(dead, srv.url, "--once", "--json", "--interval", "0.2")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["state"] for r in rows] == ["down", "up"]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [f"specdash: error: {rows[0]['error']}"]
    both_dead = attach(dead, f"http://127.0.0.1:{free_port()}", "--once")
    assert both_dead.returncode == 2 and len(both_dead.stderr.strip().splitlines()) == 2


@pytest.mark.parametrize("args, needles", [
    (["ftp://host:21", "--once"], ["ftp", "http:// or https://"]),
    (["http://host:notaport", "--once"], ["not a valid URL", "http://HOST:PORT"]),
    (["http://127.0.0.1:1", "--json"], ["--json needs --once, --watch or --prompt"]),
    (["http://127.0.0.1:1", "--interval", "0"], ["--interval", "0.1..60"]),
    (["http://127.0.0.1:1", "--once", "--header", "NoColonHere"], ["--header #1", "Name: value"]),
    (["http://127.0.0.1:1", "--once", "--watch"], ["not allowed with"]),
    (["http://127.0.0.1:1", "--count", "2"], ["--count needs --watch"]),
])
def test_usage_errors(args: list[str], needles: list[str]) -> None:
    one_error_line(attach(*args), *needles)


def test_userinfo_and_headers_are_redacted_everywhere() -> None:
    url = parse_url("http://alice:s3cret-pass@127.0.0.1:9/metrics")
    assert url.base == "http://127.0.0.1:9" and url.password == "s3cret-pass"
    client = Client(url, {"Authorization": "Bearer tok-abcdef", "X-Api-Key": "key-987654"})
    assert "s3cret" not in client.display
    message = client.redact("echo Bearer tok-abcdef key-987654 s3cret-pass http://bob:pw@x:1/ Basic dXNlcjpwYXNz")
    for secret in ("tok-abcdef", "key-987654", "s3cret-pass", "bob:pw", "dXNlcjpwYXNz"):
        assert secret not in message, message
    assert redact_url("https://u:p@h:1/x") == "https://h:1/x"
    r = Redactor()
    r.add("Bearer abcd1234")
    assert r("token abcd1234 here") == "token *** here"
    with pytest.raises(RemoteError) as info:
        client.get("/metrics")
    assert "s3cret" not in str(info.value) and "tok-abcdef" not in str(info.value)
    client.close()


def test_header_and_url_parsing() -> None:
    assert parse_header("Authorization: Bearer a:b") == ("Authorization", "Bearer a:b")
    with pytest.raises(SpecdashError) as info:
        parse_header("Bearer supersecret", 2)
    assert "supersecret" not in str(info.value) and "#2" in str(info.value)
    assert parse_url("127.0.0.1:8080").base == "http://127.0.0.1:8080"
    assert parse_url("https://gpu-7.internal/llm/v1/metrics/").base == "https://gpu-7.internal/llm/v1"
    assert parse_url("http://[::1]:8000").base == "http://[::1]:8000"


def test_timeouts_are_one_line() -> None:
    with ReplayServer(Canned({"/metrics": text("llamacpp:n_decode_total 1\n")}, delay=2.0)) as srv:
        t0 = time.monotonic()
        proc = attach(srv.url, "--once", "--timeout", "0.5")
        assert time.monotonic() - t0 < 30
    one_error_line(proc, srv.url, "no answer within 0.5s")
