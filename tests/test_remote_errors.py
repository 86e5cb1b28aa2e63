"""Bad input to `specdash attach`: one line per server naming the URL and what to do,
exit 2 when no server answered, no traceback, and no credential anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest_remote import Canned, ReplayServer, as_json, free_port, text
from specdash.contract.errors import SpecdashError
from specdash.monitor.remote.client import Client, Redactor, RemoteError, parse_header, parse_url, redact_url

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
        one_error_line(attach(srv.url, "--once"), srv.url + "/metrics", "llamacpp:, vllm:, specdash_ or specdash:")


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


# --- numbers that cannot be counts (issue 22) ---

def exposition(draft_tokens: str, per_pos: int = 2) -> str:
    lines = ["# TYPE llamacpp:n_decode_total counter", "llamacpp:n_decode_total 30",
             "# TYPE llamacpp:tokens_predicted_total counter", "llamacpp:tokens_predicted_total 40",
             "# TYPE llamacpp:spec_decode_num_drafts_total counter", "llamacpp:spec_decode_num_drafts_total 10",
             "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter",
             f"llamacpp:spec_decode_num_draft_tokens_total {draft_tokens}",
             "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter",
             "llamacpp:spec_decode_num_accepted_tokens_total 12",
             "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} 1' for i in range(per_pos)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("value, why", [("inf", "infinite"), ("-5", "negative"), ("1e308", "beyond 2^53"),
                                        ("NaN", "not a number"), ("-Inf", "infinite")])
def test_a_counter_that_cannot_be_a_count_is_a_bad_reading(value: str, why: str) -> None:
    """It crashed the poll (OverflowError in server_event), then printed an empty error."""
    with ReplayServer(Canned({"/metrics": text(exposition(value))})) as srv:
        proc = attach(srv.url, "--once", "--interval", "0.1")
    line = one_error_line(proc, srv.url + "/metrics", "bad reading",
                          "llamacpp:spec_decode_num_draft_tokens_total", why)
    assert line.rstrip() != "specdash: error:"
    assert proc.stdout.startswith(f"{srv.url}  bad · last seen"), proc.stdout


def test_a_bad_reading_keeps_polling_and_recovers() -> None:
    """One server's bad numbers: that server shows "bad" with the metric; the next good
    poll is "up" again, from the last good baseline (no negative rate, no reset)."""
    from specdash.sources.remote import RemoteSource

    pages = iter([exposition("20"), exposition("inf"), exposition("26")])
    current = {"page": ""}

    def metrics(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return text(current["page"])

    with ReplayServer(Canned({"/metrics": metrics})) as srv:
        source = RemoteSource(srv.url)
        try:
            rows = []
            for page in pages:
                current["page"] = page
                rows.append(source.poll_now())
        finally:
            source.close()
    assert [r.state for r in rows] == ["up", "bad", "up"]
    assert "llamacpp:spec_decode_num_draft_tokens_total = inf (infinite)" in rows[1].error
    assert rows[1].last_seen is not None  # it answered
    assert rows[2].resets == 0 and rows[2].num_draft_tokens == 26


def test_per_position_series_beyond_the_cap_are_dropped_with_a_note() -> None:
    """5,000 positions (300,000 took 7 s per --once): 64 are kept, the rest are noted."""
    with ReplayServer(Canned({"/metrics": text(exposition("20", per_pos=5000))})) as srv:
        proc = attach(srv.url, "--once", "--json", "--interval", "0.1")
        plain = attach(srv.url, "--once", "--interval", "0.1")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["state"] == "up"
    assert row["num_accepted_tokens_per_pos"] == [1] * 64
    assert row["note"].startswith("4936 per-position series at position 64 or beyond were dropped")
    assert plain.returncode == 0 and "note: 4936 per-position series" in plain.stdout


def test_a_far_position_allocates_nothing() -> None:
    """position="1000000000" once meant a list of a billion zeros."""
    from specdash.monitor.remote.backends import snapshot
    from specdash.monitor.remote.metrics import parse

    page = exposition("20").replace('position="1"', 'position="1000000000"')
    # Dropped before parsing (the default keeps the backends' families), or after it
    # (keep=None parses everything).
    for scrape in (parse(page), parse(page, keep=None)):
        snap = snapshot(scrape, "llamacpp")
        assert snap.counters.per_pos == [1.0]
        assert snap.notes and snap.notes[0].startswith("1 per-position series")


def test_no_error_message_is_empty(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An exception without text: the handler says which and where, not `specdash: error: `."""
    from specdash import cli
    from specdash.commands import attach as attach_cmd

    def boom(args: object) -> int:
        raise SpecdashError("")

    monkeypatch.setattr(attach_cmd, "run", boom)
    assert cli.main(["attach", "http://127.0.0.1:1", "--once"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdash: error: SpecdashError, with no message, raised in boom (test_remote_errors.py:"), err


def test_a_failure_handling_a_poll_is_shown_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug after the poll left the row "starting" with no reason (and `--once` printed
    `specdash: error: ` with nothing after it)."""
    from specdash.sources.remote import RemoteSource

    with ReplayServer(Canned({"/metrics": text(exposition("20"))})) as srv:
        source = RemoteSource(srv.url)
        try:
            def broken(t: float | None = None) -> object:
                raise OverflowError
            monkeypatch.setattr(source.watch, "server_event", broken)
            row = source.poll_now()
        finally:
            source.close()
    assert row.state == "bad"
    assert "handling a poll failed (OverflowError, with no message, raised in broken" in row.error, row.error


def test_slots_with_nonsense_numbers() -> None:
    from specdash.monitor.remote.backends import parse_slots

    data = json.loads('[{"id": 0, "is_processing": true, "next_token": {"n_decoded": Infinity}},'
                      ' {"id": "x", "is_processing": true, "id_task": NaN, "next_token": [{"n_decoded": -4}]},'
                      ' {"id": 2, "n_ctx": 1e400, "next_token": {"n_decoded": 7}}]')
    slots = parse_slots(data)
    assert [(s.id, s.n_decoded, s.id_task, s.n_ctx) for s in slots] == [(0, 0, None, None), (1, 0, None, None),
                                                                        (2, 7, None, None)]


def test_the_dropped_positions_note_is_told_once_in_the_dashboard() -> None:
    from specdash.contract.events import NoticeEvent
    from specdash.sources.remote import RemoteSource

    with ReplayServer(Canned({"/metrics": text(exposition("20", per_pos=100))})) as srv:
        source = RemoteSource(srv.url)
        emitted: list[object] = []
        source._emit = emitted.append  # as start() would, without the poller thread
        try:
            rows = [source.poll_now() for _ in range(3)]
        finally:
            source.close()
    notices = [ev.message for ev in emitted if isinstance(ev, NoticeEvent)]
    assert notices == [f"{srv.url}: 36 per-position series at position 64 or beyond were dropped: no drafter "
                       "drafts that far (specdash shows positions 0-63)"]
    assert all(len(r.num_accepted_tokens_per_pos) == 64 and r.note for r in rows)
