"""`specdash web`: attach in a real browser (Debian's chromium through Selenium), on a real
`specdash serve` (SmolLM2-135M) on 127.0.0.1.

The browser tests skip where chromium or chromedriver is missing, unless
$SPECDASH_REQUIRE_BROWSER is set (CI installs both and sets it).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest

from cli_helpers import assert_usage_error, read_url, specdash
from specdash.web.guard import authorized, cookie_name, cookie_value, host_allowed, host_name, same_origin
from test_serve import start_server, stop_server

HEADER_SECRET = "sekrit-for-the-watched-server"
WEB_KEY: list[str] = []  # the key `web` made for the module's view (its fixture)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_BROWSER = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
needs_browser = pytest.mark.skipif(
    not HAVE_BROWSER and not os.environ.get("SPECDASH_REQUIRE_BROWSER"),
    reason="chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")


# ------------------------------------------------------------------ the rules, cheaply

def test_the_guard_rules():
    assert host_name("127.0.0.1:8765") == "127.0.0.1" and host_name("[::1]:80") == "::1"
    assert same_origin("http://127.0.0.1:8765", "http", "127.0.0.1:8765")
    assert not same_origin("http://localhost:8765", "http", "127.0.0.1:8765")
    assert not same_origin("http://127.0.0.1:9000", "http", "127.0.0.1:8765")
    assert not same_origin(None, "http", "127.0.0.1:8765")
    assert host_allowed("localhost:1", None) and host_allowed("[::1]:1", None)
    assert not host_allowed("evil.example:8765", None)  # a name rebound to 127.0.0.1
    assert host_allowed("box.lan:8765", "k")
    secret = b"s" * 32
    assert authorized(None, secret, bearer=None, cookie=None, query_key=None)
    assert not authorized("k", secret, bearer=None, cookie=None, query_key=None)
    assert not authorized("k", secret, bearer="x", cookie="k", query_key="kk")  # the cookie holds a digest
    assert authorized("k", secret, bearer=None, cookie=cookie_value("k", secret), query_key=None)
    assert not authorized("k", secret, bearer=None, cookie=cookie_value("k", b"another run"), query_key=None)
    assert authorized("k", secret, bearer="k", cookie=None, query_key=None)
    assert cookie_name(8765) != cookie_name(8766)  # a host's cookies go to all its ports


def test_a_tabs_process_keeps_the_page_apart_from_stray_output():
    """Python prints and a native write to fd 1 go to stderr; the page's own bytes alone
    reach stdout, which textual-serve reads as frames."""
    code = ("import os, sys\n"
            "from specdash.web_tab import isolate_stdout\n"
            "page = isolate_stdout()\n"
            "print('stray print')\n"
            "os.write(1, b'native write\\n')\n"
            "sys.__stdout__.write('PAGE'); sys.__stdout__.flush()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"PAGE"
    assert b"stray print" in proc.stderr and b"native write" in proc.stderr


@pytest.mark.parametrize("argv, needles", [
    (["web", "--host", "0.0.0.0"], ["--host 0.0.0.0", "API key"]),
    (["web", "ftp://x"], ["ftp://x"]),
    (["web", "--header", "no colon"], ["--header #1", "Name: value"]),
    (["web", "--port", "70000"], ["--port 70000"]),
])
def test_bad_input_is_one_line_and_exit_2(argv, needles):
    assert_usage_error(specdash(*argv, timeout=60), *needles)


# ------------------------------------------------------------------ real servers

def start_web(*args: str) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "specdash", "web", "--port", "0", *args],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url, lines = read_url(proc, r"listening on (http://\S+/)")
    return proc, url, lines


def tab_processes(web: subprocess.Popen) -> list[psutil.Process]:
    """The web server's tab processes (textual-serve starts each through a shell)."""
    out = []
    for child in psutil.Process(web.pid).children(recursive=True):
        try:
            if "specdash.web_tab" in " ".join(child.cmdline()) and child.name().startswith("python"):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def served():
    proc, url, lines = start_server("--target", "smollm2-135m", "--draft", "none")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def web(served, tmp_path_factory):
    shots = tmp_path_factory.mktemp("web-shots")
    proc, url, lines = start_web(served, "--screenshots", str(shots), "--interval", "0.5",
                                 "--header", f"Authorization: Bearer {HEADER_SECRET}")
    # --header without a key: the page carries those credentials, so a key is made and
    # printed, and only that URL opens it.
    (keyed,) = re.findall(r"open it once as (http://\S+\?key=\S+);", "".join(lines))
    assert keyed.startswith(url) and httpx.get(url).status_code == 401
    WEB_KEY.append(keyed.split("?key=", 1)[1])
    yield url, shots, proc, lines
    proc.terminate()
    assert proc.wait(20) == 0, "".join(lines)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(what, timeout: float = 60, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {getattr(what, '__name__', what)}")


def app_drew(driver) -> bool:
    """textual-serve's page adds -first-byte to the body when the app's first frame arrives."""
    return "-first-byte" in (driver.find_element("tag name", "body").get_attribute("class") or "")


def svg_text(path: Path) -> str:
    return html.unescape(path.read_text()).replace("\xa0", " ")


@needs_browser
def test_the_page_loads_a_key_reaches_the_app_and_closing_the_tab_stops_nothing(served, web):
    import openai

    url, shots, proc, lines = web
    client = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=120)

    driver = browser()
    try:
        driver.get(url + "?key=" + WEB_KEY[0])  # once: the cookie opens the next tab
        wait_for(lambda: app_drew(driver))
        (first_tab,) = tab_processes(proc)
        # The watched server's key (--header) is on no tab's command line (nor its shell's).
        shells = [p for p in first_tab.parents() if p.pid != proc.pid and proc.pid in {a.pid for a in p.parents()}]
        for p in [first_tab, *shells]:
            assert HEADER_SECRET not in " ".join(p.cmdline())
        # A second tab is a second process; closing it ends that one only.
        page = driver.current_window_handle
        driver.switch_to.new_window("tab")
        driver.get(url)
        wait_for(lambda: app_drew(driver))
        assert len(tab_processes(proc)) == 2
        driver.close()
        driver.switch_to.window(page)
        wait_for(lambda: [p.pid for p in tab_processes(proc)] == [first_tab.pid], timeout=20)
        keys = driver.find_element("css selector", ".xterm-helper-textarea")
        time.sleep(1.0)  # the first poll of the server
        keys.send_keys("s")  # the app's own screenshot, saved on this machine
        first_shot = wait_for(lambda: sorted(shots.glob("*.svg")))[-1]
        keys.send_keys("l")  # the requests screen
        time.sleep(1.1)  # and a screenshot name of another second
        keys.send_keys("s")
        shot = wait_for(lambda: [p for p in sorted(shots.glob("*.svg")) if p != first_shot])[-1]
        before, after = svg_text(first_shot), svg_text(shot)
        port = served.rsplit(":", 1)[1]
        assert port in before and "Acceptance length" not in before, before[-3000:]  # the server's panels
        assert "Acceptance length" in after, after[-3000:]  # the requests screen, opened by `l`

        # A stream in flight while the tab closes: it completes, and the tab's process ends.
        done: dict[str, object] = {}
        first = threading.Event()

        def stream() -> None:
            parts = []
            for chunk in client.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=48,
                                                   temperature=0, stream=True):
                first.set()
                parts.append(chunk)
            done["finish"] = parts[-1].choices[0].finish_reason
            done["n"] = len([p for p in parts if p.choices and p.choices[0].text])

        worker = threading.Thread(target=stream)
        worker.start()
        assert first.wait(60)
    finally:
        driver.quit()
    worker.join(120)
    assert done.get("finish") == "length", done
    wait_for(lambda: not tab_processes(proc), timeout=20)
    assert httpx.get(served + "/health", timeout=5).status_code == 200
    assert proc.poll() is None, "".join(lines)


class _OtherSite(BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args) -> None:
        pass


@needs_browser
def test_a_page_from_another_origin_cannot_open_the_websocket(web):
    url, _, proc, _ = web
    ws = url.replace("http://", "ws://") + "ws?width=80&height=24"
    _OtherSite.page = (
        "<html><head><title>waiting</title></head><body><script>"
        f"const ws = new WebSocket({ws!r});"
        "ws.onopen = () => { document.title = 'opened'; };"
        "ws.onerror = () => { if (document.title !== 'opened') document.title = 'refused'; };"
        "</script></body></html>").encode()
    other = ThreadingHTTPServer(("127.0.0.1", 0), _OtherSite)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    driver = browser()
    try:
        driver.get(f"http://127.0.0.1:{other.server_address[1]}/")
        assert wait_for(lambda: driver.title if driver.title != "waiting" else None, timeout=30) == "refused"
        assert not tab_processes(proc)
    finally:
        driver.quit()
        other.shutdown()
    # The same refusal without a browser, and the Host rule (a name rebound to 127.0.0.1).
    host = url.split("//")[1].rstrip("/")
    r = httpx.get(url + "ws", headers={"Origin": "http://evil.example", "Connection": "Upgrade",
                                        "Upgrade": "websocket"})
    assert r.status_code == 403 and "another origin" in r.text
    r = httpx.get(url, headers={"Host": "evil.example:" + host.split(":")[1]})
    assert r.status_code == 403 and "loopback" in r.text


@needs_browser
def test_with_a_key_the_page_needs_it_once_and_a_cookie_keeps_it(served):
    proc, url, lines = start_web(served, "--api-key", "s3cret")
    try:
        assert httpx.get(url).status_code == 401
        assert httpx.get(url + "?key=wrong").status_code == 401
        host = url.split("//")[1].rstrip("/")
        port = int(host.rsplit(":", 1)[1])
        r = httpx.get(url + "?key=s3cret&next=//evil.example")
        assert r.status_code == 302 and r.headers["location"] == "/"  # never elsewhere
        set_cookie = r.headers["set-cookie"]
        assert set_cookie.startswith(cookie_name(port) + "=") and "s3cret" not in set_cookie
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        assert r.headers["x-frame-options"] == "DENY"
        cookies = {cookie_name(port): set_cookie.split(";")[0].split("=", 1)[1]}
        page = httpx.get(url, cookies=cookies)
        assert page.status_code == 200 and page.headers["content-security-policy"] == "frame-ancestors 'none'"
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        r = httpx.get(url + "ws", headers={"Origin": f"http://{host}"})
        assert r.status_code == 401  # the right page, no key
        r = httpx.get(url + "ws", headers={"Origin": "http://evil.example"}, cookies=cookies)
        assert r.status_code == 403  # the key, from another page
        driver = browser()
        try:
            driver.get(url + "?key=s3cret")
            wait_for(lambda: app_drew(driver))
            assert "key" not in driver.current_url
        finally:
            driver.quit()
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, "".join(lines)


def test_tabs_are_capped_their_size_clamped_and_a_password_never_shown(served):
    """--max-tabs bounds the processes a page can fork; a tab's size is clamped; a URL's
    password stays out of the page's title and the log; --header makes the page keyed."""
    import asyncio

    import aiohttp

    watched = served.replace("http://", "http://operator:pa55word@")
    proc, url, lines = start_web(watched, "--max-tabs", "1", "--header", f"X-Api-Key: {HEADER_SECRET}")
    try:
        (keyed,) = re.findall(r"open it once as (http://\S+\?key=\S+);", "".join(lines))
        key = keyed.split("?key=", 1)[1]
        auth = {"Authorization": f"Bearer {key}"}
        page = httpx.get(url, headers=auth)
        assert page.status_code == 200 and "pa55word" not in page.text and "pa55word" not in "".join(lines)
        host = url.split("//")[1].rstrip("/")

        async def tabs() -> tuple[int, int]:
            headers = {**auth, "Origin": f"http://{host}"}
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url + "ws?width=100000&height=100000", headers=headers) as first:
                    (tab,) = wait_for(lambda: tab_processes(proc))
                    env = tab.environ()
                    try:
                        async with session.ws_connect(url + "ws", headers=headers):
                            second = 101
                    except aiohttp.WSServerHandshakeError as exc:
                        second = exc.status
                    await first.close()
                    return int(env["COLUMNS"]) * 10000 + int(env["ROWS"]), second

        size, second = asyncio.run(tabs())
        assert divmod(size, 10000) == (1000, 500) and second == 503, (size, second)
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, "".join(lines)
