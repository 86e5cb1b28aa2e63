"""What does watching a fleet cost? `specdash attach` on 8 endpoints at 1 s polling.

8 small HTTP servers (in a child process, so their CPU is not counted) replay the
/metrics, /slots and /props responses recorded from a real llama-server with speculation
(tests/fixtures/llamacpp/: five scrapes 1.5 s apart while a request ran; each server plays
them in order and then keeps answering the last one, so every poll is of a busy server
and no counter ever goes down).
The attaching process is the real CLI, `specdash attach URL x8 --watch --json` with its
output thrown away (or, with --mode fleet, the dashboard `specdash attach` opens on several URLs, headless);
psutil measures its CPU time over --seconds after a warm-up. Target: < 3% of one core.

    python benchmarks/attach_overhead.py [--servers 8] [--interval 1] [--seconds 60] [--mode watch|fleet]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llamacpp"

FLEET_APP = """
import sys
from specdash.sources.remote import RemoteSource
from specdash.tui.fleet_app import FleetDashboard
interval = float(sys.argv[1])
sources = [RemoteSource(url, interval=interval) for url in sys.argv[2:]]
FleetDashboard(sources, screenshots_dir="/tmp").run(headless=True, size=(160, 30))
"""


def recorded() -> dict[str, list[bytes]]:
    """Recorded responses by path: metrics_*.txt / slots_*.json in order, props.json."""
    out: dict[str, list[bytes]] = {
        "/metrics": [p.read_bytes() for p in sorted(FIXTURES.glob("metrics_*.txt"))],
        "/slots": [p.read_bytes() for p in sorted(FIXTURES.glob("slots_*.json"))],
        "/props": [(FIXTURES / "props.json").read_bytes()],
    }
    missing = [path for path, bodies in out.items() if not bodies]
    if missing:
        raise SystemExit(f"no recorded responses for {', '.join(missing)} in {FIXTURES}")
    return out


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(n: int) -> None:
    """Child mode: n replaying servers; prints their URLs as one JSON line; runs until stdin closes."""
    bodies = recorded()
    ctypes = {"/metrics": "text/plain; version=0.0.4", "/slots": "application/json", "/props": "application/json"}
    servers = []
    for _ in range(n):
        counter = {"/metrics": 0, "/slots": 0, "/props": 0}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            seen = counter

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path not in bodies:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                i = self.seen[path]
                self.seen[path] = i + 1
                body = bodies[path][min(i, len(bodies[path]) - 1)]
                self.send_response(200)
                self.send_header("Content-Type", ctypes[path])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        httpd = _QuietServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
    print(json.dumps([f"http://127.0.0.1:{s.server_address[1]}" for s in servers]), flush=True)
    sys.stdin.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--mode", choices=("watch", "fleet"), default="watch")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0

    servers = subprocess.Popen([sys.executable, __file__, "--serve", str(args.servers)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert servers.stdout is not None and servers.stdin is not None
    urls = json.loads(servers.stdout.readline())
    if args.mode == "watch":
        cmd = [sys.executable, "-m", "specdash", "attach", *urls, "--watch", "--json",
               "--interval", str(args.interval)]
    else:
        cmd = [sys.executable, "-c", FLEET_APP, str(args.interval), *urls]
    attach = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        proc = psutil.Process(attach.pid)
        time.sleep(args.warmup)
        if attach.poll() is not None:
            raise SystemExit(f"attach exited early: {attach.stderr.read() if attach.stderr else ''}")
        t0, c0 = time.monotonic(), proc.cpu_times()
        time.sleep(args.seconds)
        t1, c1 = time.monotonic(), proc.cpu_times()
        threads = proc.num_threads()
        rss = proc.memory_info().rss
    finally:
        attach.terminate()
        attach.wait(10)
        servers.stdin.close()
        servers.wait(10)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    share = 100.0 * cpu / (t1 - t0)
    print(f"attach ({args.mode}) to {args.servers} endpoints at {args.interval:g} s polling, "
          f"{t1 - t0:.0f} s measured: {share:.2f}% of one core "
          f"(user {c1.user - c0.user:.2f} s, system {c1.system - c0.system:.2f} s; "
          f"{threads} threads, RSS {rss / 2**20:.0f} MiB); target < 3%: {'PASS' if share < 3 else 'FAIL'}")
    return 0 if share < 3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
